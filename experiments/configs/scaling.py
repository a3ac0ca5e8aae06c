"""The memory scaling curve alone, over a larger synthetic world, for the three read settings of rows ⑤-⑦."""

from experiments.pipeline_config import PipelineConfig
from memllm_jax.settings import replace


def get_config() -> PipelineConfig:
    return replace(PipelineConfig(), {"name": "scaling", "table2.rows": (), "editing.records": "",
                                      "data.synth_docs": 3000, "scaling.sizes": (0, 100, 1000, 10000, 30000),
                                      "scaling.growth_checkpoints": (100, 300, 1000, 3000, 10000, 30000, 60000)})


def sweep(add) -> None:
    for row in ("row5", "row6", "row7"):
        add(row, f"scaling.row='{row}'")
