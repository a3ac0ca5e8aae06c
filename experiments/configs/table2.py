"""Table 2 on the embedded default's artefacts; the sweep evaluates one row per point (models are trained
once: only the table2 stage's settings change between points)."""

from experiments.pipeline_config import PipelineConfig
from memllm_jax.eval.rows import ROWS


def get_config() -> PipelineConfig:
    return PipelineConfig(name="table2", editing="", scaling_sizes=(), growth_checkpoints=())


def sweep(add) -> None:
    for key in ROWS:
        if not key.startswith(("row1", "row2")):
            add(key, f"rows=('{key}',)")
