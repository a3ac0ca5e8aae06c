"""The paper's memory-write adapter: LoRA on Mistral-7B-v0.1 with Appendix D's hyperparameters
(lr 2e-5, 2 epochs, global batch 96, r 16 / alpha 8 / dropout 0.1, context 1024), bf16 compute and remat,
FSDP over a TPU pod slice or a multi-GPU host (see docs/train.md for launch commands)."""

import dataclasses

from memllm_jax.config import MISTRAL_7B, LoraConfig, MeshConfig
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        name="mw_mistral7b",
        model=dataclasses.replace(MISTRAL_7B, param_dtype="bfloat16", compute_dtype="bfloat16", remat=True,
                                  max_seq_len=1024),
        mode="lora",
        train_markers=True,
        lora=LoraConfig(rank=16, alpha=8.0, dropout=0.1),
        mesh=MeshConfig(data=1, fsdp=-1, tensor=1),
        train_data=("runs/redocred/data/train/write.jsonl",),
        eval_data=("runs/redocred/data/dev/write.jsonl",),
        tokenizer="checkpoints/mistral-7b-v0.1",
        seq_len=1024,
        packing="pad",
        buckets=(256, 512, 1024),
        global_batch=96,
        micro_batches=4,
        steps=None,
        epochs=2.0,
        lr=2e-5,
        warmup_steps=50,
        schedule="linear",
        end_lr_fraction=0.0,
        weight_decay=0.0,
        clip_norm=1.0,
        eval_every=500,
        eval_batch=32,
        log_every=10,
        checkpoint_every=500,
        keep_checkpoints=3,
        workdir="runs/redocred/train/mw",
        init_checkpoint="checkpoints/mistral-7b-v0.1",
        compilation_cache=".xla_cache",
    )


def sweep(add) -> None:
    for lr in (1e-5, 2e-5, 5e-5):
        add(f"lr{lr:g}", f"lr={lr}")
    add("rank64", "lora.rank=64", "lora.alpha=32.0")
