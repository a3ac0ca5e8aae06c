"""Table 3 on the ZsRE file alone (no Table 2 rows, no scaling), with a sweep over the number of sequential edits."""

from experiments.configs import paths
from experiments.pipeline_config import PipelineConfig
from memllm_jax.settings import replace


def get_config() -> PipelineConfig:
    return replace(PipelineConfig(), {"name": "editing_zsre", "table2.rows": (), "editing.records": paths.zsre(),
                                      "editing.n_edits": 200, "scaling.sizes": (), "scaling.growth_checkpoints": ()})


def sweep(add) -> None:
    for t in (1, 10, 50, 200):
        add(f"T{t}", f"editing.n_edits={t}", "editing.regimes=('sequential',)")
