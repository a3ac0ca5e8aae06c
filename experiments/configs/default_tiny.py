"""The embedded default with a tiny base pretrained from scratch here: synthetic corpus with a held-out
evaluation world, tiny base, both adapters, Table 2 rows, a Table 3 analogue on synthetic edits and the scaling
curve, in about 12 minutes on a 2-core CPU. Its models do not learn to copy names from their context, which both
memory skills need, so the method does not show; `default` starts from SmolLM2-135M instead."""

from experiments.pipeline_config import PipelineConfig


def get_config() -> PipelineConfig:
    return PipelineConfig(name="default_tiny")


def sweep(add) -> None:
    add("shared_world", "heldout_world=False")
    add("default_tiny")
