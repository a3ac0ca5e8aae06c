"""The memory-read LoRA adapter on the pretrained SmolLM2-135M base: the memory-write adapter's settings
(experiments/configs/mw_smollm2.py) on the read examples, whose loss spans are the query call and the text
after the answer."""

import dataclasses

from experiments.configs import mw_smollm2
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return dataclasses.replace(
        mw_smollm2.get_config(),
        name="mr_smollm2",
        train_data=("runs/default/data/train/read.jsonl",),
        workdir="runs/default/train/mr",
        steps=64,
    )


def sweep(add) -> None:
    for steps in (15, 30, 60):
        add(f"steps{steps}", f"steps={steps}")
