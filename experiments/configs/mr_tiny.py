"""The memory-read LoRA adapter on the tiny base: the memory-write adapter's settings (experiments/configs/
mw_tiny.py) on the read examples, whose loss spans are the query call and the text after the answer.

400 steps at lr 5e-3: a from-scratch tiny base needs that many before its queries copy names well enough to
retrieve (after 150 steps they were garbled)."""

import dataclasses

from experiments.configs import mw_tiny
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return dataclasses.replace(
        mw_tiny.get_config(),
        name="mr_tiny",
        train_data=("runs/default/data/train/read.jsonl",),
        workdir="runs/default/train/mr",
        steps=400,
        lr=5e-3,
    )


def sweep(add) -> None:
    for lr in (1e-3, 3e-3, 1e-2):
        add(f"lr{lr:g}", f"lr={lr}")
    for r in (4, 16, 64):
        add(f"rank{r}", f"lora.rank={r}")
