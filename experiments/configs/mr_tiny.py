"""The memory-read LoRA adapter on the tiny base (loss on the spans the read examples flag: the query call
and the text after the answer), 400 steps: a from-scratch tiny base needs that many before its queries copy names well enough to retrieve (150 steps left them garbled). Paper LoRA shape (Appendix D) with a CPU-sized schedule."""

from memllm_jax.config import DEFAULT_TINY, LoraConfig
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        name="mr_tiny",
        model=DEFAULT_TINY,
        mode="lora",
        lora=LoraConfig(rank=16, alpha=8.0, dropout=0.1),
        train_data=("runs/default/data/train/read.jsonl",),
        tokenizer="runs/default/tokenizer",
        eval_fraction=0.02,
        eval_max_examples=128,
        seq_len=256,
        packing="pad",
        buckets=(128, 256),
        global_batch=16,
        steps=400,
        epochs=None,
        lr=5e-3,
        warmup_steps=15,
        schedule="cosine",
        weight_decay=0.0,
        clip_norm=1.0,
        eval_every=50,
        eval_batch=32,
        log_every=10,
        checkpoint_every=50,
        workdir="runs/default/train/mr",
        init_checkpoint="runs/default/train/pretrain/params",
        compilation_cache=".xla_cache",
    )


def sweep(add) -> None:
    for lr in (1e-3, 3e-3, 1e-2):
        add(f"lr{lr:g}", f"lr={lr}")
    for r in (4, 16, 64):
        add(f"rank{r}", f"lora.rank={r}")
