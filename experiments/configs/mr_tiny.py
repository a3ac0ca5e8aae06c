"""The memory-read LoRA adapter on the tiny base: the memory-write adapter's settings (experiments/configs/
mw_tiny.py) on the read examples, whose loss spans are the query call and the text after the answer.

300 packed steps (about 9,600 examples, one epoch of the synthetic corpus's read examples): a from-scratch
tiny base needs about that much before its queries copy names well enough to retrieve."""

import dataclasses

from experiments.configs import mw_tiny
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return dataclasses.replace(
        mw_tiny.get_config(),
        name="mr_tiny",
        train_data=("runs/default/data/train/read.jsonl",),
        workdir="runs/default/train/mr",
        steps=300,
    )


def sweep(add) -> None:
    for lr in (1e-3, 3e-3, 1e-2):
        add(f"lr{lr:g}", f"lr={lr}")
    for r in (4, 16, 64):
        add(f"rank{r}", f"lora.rank={r}")
