"""The paper's run: Mistral-7B with Appendix D's LoRA recipe, trained on Re-DocRED train, developed on dev,
evaluated on test (Table 2's rows, the memory-write model's precision / recall), Table 3 on ZsRE, and the scaling
curve to 100k distractor triples. The files come from `experiments.configs.paths` (environment variables).

    memllm run --config mistral7b --out runs/mistral7b --dry-run     # check every input, print the work and plans
    memllm run --config mistral7b --out runs/mistral7b               # on an accelerator host (one process per host)
"""

from experiments import recipes
from experiments.configs import paths
from experiments.pipeline_config import PipelineConfig
from memllm_jax.settings import replace


def get_config() -> PipelineConfig:
    return replace(PipelineConfig(), {
        "name": "mistral7b", "matmul_dtype": None,  # the recipe's bf16 weights and compute
        "data.corpus": paths.redocred("train"), "data.dev_corpus": paths.redocred("dev"),
        "data.eval_corpus": paths.redocred("test"), "data.labels": paths.docred_labels(),
        "data.eval_docs": 500, "data.outside_docs": 0,
        "base.model": paths.mistral_7b(), "mw": recipes.MW_MISTRAL7B, "mr": recipes.MR_MISTRAL7B,
        "write.batch": 64, "write.max_new_tokens": 192, "write.min_confidence": None,
        "table2.rows": ("baseline1", "baseline2", "row3", "row4", "row5", "row6", "row7", "row8", "row9"),
        "table2.batch": 16,
        "editing.records": paths.zsre(), "editing.n_edits": 1000,
        "scaling.sizes": (0, 10000, 100000), "scaling.growth_checkpoints": (1000, 10000, 100000, 1000000),
    })


def sweep(add) -> None:
    """One Table 2 row per point (each a separate job on a pod)."""
    for row in ("baseline1", "baseline2", "row3", "row4", "row5", "row6", "row7", "row8", "row9"):
        add(row, f"table2.rows=('{row}',)")
