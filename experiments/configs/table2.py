"""Table 2 alone, one row per sweep point (rows ① and ② need the outside documents' memory, so they run with
the whole table: `memllm run`)."""

from experiments.pipeline_config import TABLE2_ROWS, PipelineConfig
from memllm_jax.settings import replace


def get_config() -> PipelineConfig:
    return replace(PipelineConfig(), {"name": "table2", "editing.records": "", "scaling.sizes": (),
                                      "scaling.growth_checkpoints": ()})


def sweep(add) -> None:
    for key in TABLE2_ROWS:
        if not key.startswith(("row1", "row2")):
            add(key, f"table2.rows=('{key}',)")
