"""The paper's setting with Mistral-7B (TPU/GPU): Re-DocRED test as the evaluation corpus, MW / MR
adapters from experiments/configs/{mw,mr}_mistral7b.py (LoRA r=16, alpha=8, dropout 0.1, Adam 2e-5,
batch 96, 2 epochs), memory thresholds tau_e = tau_t = 0.7, tau_r = 0.85, editing thresholds 0.85/0.2/0.6,
1000 sequential ZsRE edits. Needs the HF Mistral-7B-v0.1 directory (with the API markers added to its
tokenizer) at $MISTRAL_7B_DIR or checkpoints/mistral-7b-v0.1. Run: memllm run --config mistral7b_eval --out outputs/mistral7b"""

import os
import pathlib

from experiments.pipeline_config import PipelineConfig

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


def get_config() -> PipelineConfig:
    return PipelineConfig(name="mistral7b", corpus=str(SHARED / "redocred" / "test_revised.json"),
                          labels=str(SHARED / "docred" / "rel_info.json"), eval_docs=500 // 5,
                          base_model=os.environ.get("MISTRAL_7B_DIR", "checkpoints/mistral-7b-v0.1"),
                          mw_config="mw_mistral7b", mr_config="mr_mistral7b",
                          encoder="minilm", eval_batch=16, editing=str(SHARED / "zsre" / "zsre_dev200.json"),
                          n_edits=1000, scaling_sizes=(0, 10000, 100000),
                          growth_checkpoints=(1000, 10000, 100000, 1000000),
                          parallel_adapters=False)  # one accelerator: train the adapters one after the other


def sweep(add) -> None:
    for row in ("baseline1", "baseline2", "row3", "row4", "row5", "row6", "row7", "row8", "row9"):
        add(row, f"rows=('{row}',)")
