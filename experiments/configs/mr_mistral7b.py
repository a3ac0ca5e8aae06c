"""The paper's memory-read adapter: the memory-write adapter's Mistral-7B settings (Appendix D; see
experiments/configs/mw_mistral7b.py) on the read examples."""

import dataclasses

from experiments.configs import mw_mistral7b
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return dataclasses.replace(
        mw_mistral7b.get_config(),
        name="mr_mistral7b",
        train_data=("runs/redocred/data/train/read.jsonl",),
        eval_data=("runs/redocred/data/dev/read.jsonl",),
        workdir="runs/redocred/train/mr",
    )


def sweep(add) -> None:
    for lr in (1e-5, 2e-5, 5e-5):
        add(f"lr{lr:g}", f"lr={lr}")
    add("rank64", "lora.rank=64", "lora.alpha=32.0")
