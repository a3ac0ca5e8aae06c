"""Table 3: knowledge editing on ZsRE (../shared/data/zsre/zsre_dev200.json; skipped when absent) with the
embedded default's models. The sweep varies the number of sequential edits T."""

import pathlib

from experiments.pipeline_config import PipelineConfig

ZSRE = str(pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "zsre" / "zsre_dev200.json")


def get_config() -> PipelineConfig:
    return PipelineConfig(name="editing_zsre", rows=(), editing=ZSRE, n_edits=200, scaling_sizes=(),
                          growth_checkpoints=())


def sweep(add) -> None:
    for t in (1, 10, 50, 200):
        add(f"T{t}", f"n_edits={t}", "editing_regimes=('sequential',)")
