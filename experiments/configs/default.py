"""The embedded-default main job (`make run`): synthetic corpus, tiny base, both adapters, Table 2 rows,
a Table 3 analogue on synthetic edits and the scaling curve, on a 2-core CPU."""

from experiments.pipeline import PipelineConfig


def get_config() -> PipelineConfig:
    return PipelineConfig(name="default")


def sweep(add) -> None:
    add("small_world", "synth_docs=800")
    add("default")
