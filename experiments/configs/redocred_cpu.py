"""Re-DocRED test (../shared/data/redocred/test_revised.json, 500 documents) split into 450 training and 50
held-out documents, with the tiny model on CPU. Run: memllm run --config redocred_cpu --out outputs/redocred"""

import pathlib

from experiments.pipeline_config import PipelineConfig

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


def get_config() -> PipelineConfig:
    return PipelineConfig(name="redocred_cpu", corpus=str(SHARED / "redocred" / "test_revised.json"),
                          labels=str(SHARED / "docred" / "rel_info.json"), eval_docs=50, vocab_size=4096,
                          editing=str(SHARED / "zsre" / "zsre_dev200.json"), n_edits=50,
                          scaling_sizes=(0, 1000, 10000), growth_checkpoints=(100, 1000, 3000, 10000))


def sweep(add) -> None:
    add("eval50")
    add("eval100", "eval_docs=100")
