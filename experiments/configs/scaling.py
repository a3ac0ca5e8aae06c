"""Scaling the stored triples: TARGET PPL as distractors grow and Figure 4's records-per-triple ratio."""

from experiments.pipeline_config import PipelineConfig


def get_config() -> PipelineConfig:
    return PipelineConfig(name="scaling", rows=(), editing="", synth_docs=3000,
                          scaling_sizes=(0, 100, 1000, 10000, 30000),
                          growth_checkpoints=(100, 300, 1000, 3000, 10000, 30000, 60000))


def sweep(add) -> None:
    for row in ("row5", "row6", "row7"):
        add(row, f"scaling_row='{row}'")
