"""The whole pipeline on a tiny base pretrained here (2 layers, vocabulary 4096 trained on the corpus): minutes on a
CPU, for checking the plumbing end to end; its figures are not the paper's effect."""

from data_gen.recipes import ReadRecipe, WriteRecipe
from experiments import recipes
from experiments.pipeline_config import EditingConfig, PipelineConfig, WriteConfig
from memllm_jax.settings import replace


def get_config() -> PipelineConfig:
    return replace(PipelineConfig(), {
        "name": "default_tiny", "matmul_dtype": None,
        "data.outside_docs": 0, "data.write": WriteRecipe(), "data.read": ReadRecipe(),
        "base.model": "", "mw": recipes.MW_TINY, "mr": recipes.MR_TINY,
        "write": WriteConfig(late_stopping=True, grounded=False, min_confidence=None),
        "table2.rows": ("baseline1", "baseline2", "row3", "row4", "row5", "row6", "row7", "row8", "row9"),
        "editing": EditingConfig(n_edits=16, memory="editing"),
        "scaling.sizes": (0, 100, 1000, 5000),
    })


def sweep(add) -> None:
    """The held-out world against one world shared by training and evaluation documents."""
    add("shared_world", "data.heldout_world=False")
    add("default_tiny")
