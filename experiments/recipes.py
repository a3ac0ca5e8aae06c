"""The training recipes of the pipeline's models, as `TrainConfig` values without paths.

`experiments.pipeline.Pipeline` fills in each run's paths (training data, tokenizer, workdir, base); a config
changes a recipe with `dataclasses.replace` or `--set mw.steps=300`.
"""

from __future__ import annotations

import dataclasses

from memllm_jax.config import DEFAULT_TINY, MISTRAL_7B, SMOLLM2_135M, LoraConfig, MeshConfig
from memllm_jax.train.config import TrainConfig

PRETRAIN_TINY = TrainConfig(
    name="pretrain_tiny", model=DEFAULT_TINY, mode="full", eval_fraction=0.05, seq_len=128, packing="pack",
    global_batch=16, steps=250, epochs=None, lr=3e-3, warmup_steps=25, schedule="cosine", end_lr_fraction=0.05,
    weight_decay=0.05, clip_norm=1.0, eval_every=50, eval_batch=32, log_every=10, checkpoint_every=50,
    workdir="", compilation_cache=".xla_cache")
"""The tiny base pretrained here when no pretrained base is given (`BaseConfig.model=""`)."""

MW_TINY = TrainConfig(
    name="mw_tiny", model=DEFAULT_TINY, mode="lora", lora=LoraConfig(rank=16, alpha=8.0, dropout=0.0),
    eval_fraction=0.02, eval_max_examples=128, seq_len=256, packing="pack_examples",
    buckets=(128, 256),  # the held-out evaluation's row lengths (training rows are all seq_len)
    global_batch=8, steps=200, epochs=None, lr=5e-3, warmup_steps=15, schedule="cosine", weight_decay=0.0,
    clip_norm=1.0, eval_every=100, eval_batch=32, log_every=10, checkpoint_every=50, workdir="",
    compilation_cache=".xla_cache")
"""LoRA on the tiny pretrained base: the memory-write adapter."""

MR_TINY = dataclasses.replace(MW_TINY, name="mr_tiny", steps=300)
"""The memory-read adapter on the tiny base."""

MW_SMOLLM2 = TrainConfig(
    name="mw_smollm2", model=SMOLLM2_135M, mode="lora", train_markers=True,
    lora=LoraConfig(rank=16, alpha=32.0, dropout=0.0), eval_fraction=0.02, eval_max_examples=48, seq_len=256,
    packing="pack_prefixes", buckets=(128, 256), global_batch=8, steps=96, epochs=None, lr=1e-3, warmup_steps=3,
    schedule="cosine", end_lr_fraction=0.1, weight_decay=0.0, clip_norm=1.0, eval_every=0, eval_batch=16,
    log_every=5, checkpoint_every=0, workdir="", compilation_cache=".xla_cache")
"""The memory-write adapter on SmolLM2-135M: LoRA r16 on every linear layer with the API markers' embedding rows
trained (they are new tokens of a pretrained vocabulary); a higher rate than the paper's 7B recipe suits a
135M-parameter base."""

MR_SMOLLM2 = dataclasses.replace(MW_SMOLLM2, name="mr_smollm2", steps=64)
"""The memory-read adapter on SmolLM2-135M (its examples are fewer and shorter than the writer's)."""

MW_MISTRAL7B = TrainConfig(
    name="mw_mistral7b", model=dataclasses.replace(MISTRAL_7B, param_dtype="bfloat16", compute_dtype="bfloat16", remat=True,
                                         max_seq_len=1024),
    mode="lora", train_markers=True, lora=LoraConfig(rank=16, alpha=8.0, dropout=0.1),
    mesh=MeshConfig(data=1, fsdp=-1, tensor=1), seq_len=1024, packing="pad", buckets=(256, 512, 1024),
    global_batch=96, micro_batches=4, steps=None, epochs=2.0, lr=2e-5, warmup_steps=50, schedule="linear",
    end_lr_fraction=0.0, weight_decay=0.0, clip_norm=1.0, eval_every=500, eval_batch=32, log_every=10,
    checkpoint_every=500, keep_checkpoints=3, workdir="", compilation_cache=".xla_cache")
"""Appendix D's recipe on Mistral-7B: LoRA r16, alpha 8, dropout 0.1 on every linear layer, lr 2e-5 with a linear
decay, 2 epochs, batch 96; bf16 weights with rematerialisation, parameters sharded over every device (FSDP)."""

MR_MISTRAL7B = dataclasses.replace(MW_MISTRAL7B, name="mr_mistral7b")
"""The memory-read adapter on Mistral-7B: the same recipe."""
