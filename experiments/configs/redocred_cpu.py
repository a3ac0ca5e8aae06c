"""The tiny pipeline (`default_tiny`) on Re-DocRED: the test file split into training and 50 evaluation documents,
Table 3 on the ZsRE file; minutes on a CPU, for checking the real-data plumbing."""

from experiments.configs import default_tiny, paths
from memllm_jax.settings import replace


def get_config():
    return replace(default_tiny.get_config(), {
        "name": "redocred_cpu", "data.corpus": paths.redocred("test"), "data.labels": paths.docred_labels(),
        "data.eval_docs": 50, "editing.records": paths.zsre(), "editing.n_edits": 50,
        "scaling.sizes": (0, 1000, 10000), "scaling.growth_checkpoints": (100, 1000, 3000, 10000)})


def sweep(add) -> None:
    add("eval50")
    add("eval100", "data.eval_docs=100")
