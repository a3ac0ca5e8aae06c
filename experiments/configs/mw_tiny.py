"""The memory-write LoRA adapter on the tiny base (loss on the `({MEM_WRITE-->...})` span), 4.4 minutes on
this 2-core CPU in the last main job. Paper shape (Appendix D: r 16, alpha 8) with a CPU-sized schedule:
whole examples packed into rows of 256 tokens (about 30 per step, 200 steps: ~0.75 epoch), and no adapter
dropout - the paper's 0.1 regularises epochs of finetuning, while this run sees most examples once, and on
CPU the dropout masks cost ~30% of the step time."""

from memllm_jax.config import DEFAULT_TINY, LoraConfig
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        name="mw_tiny",
        model=DEFAULT_TINY,
        mode="lora",
        lora=LoraConfig(rank=16, alpha=8.0, dropout=0.0),
        train_data=("runs/default/data/train/write.jsonl",),
        tokenizer="runs/default/tokenizer",
        eval_fraction=0.02,
        eval_max_examples=128,
        seq_len=256,
        packing="pack_examples",
        buckets=(128, 256),  # the held-out evaluation's row lengths (training rows are all seq_len)
        global_batch=8,
        steps=200,
        epochs=None,
        lr=5e-3,
        warmup_steps=15,
        schedule="cosine",
        weight_decay=0.0,
        clip_norm=1.0,
        eval_every=100,
        eval_batch=32,
        log_every=10,
        checkpoint_every=50,
        workdir="runs/default/train/mw",
        init_checkpoint="runs/default/train/pretrain",
        compilation_cache=".xla_cache",
    )


def sweep(add) -> None:
    for lr in (1e-3, 3e-3, 1e-2):
        add(f"lr{lr:g}", f"lr={lr}")
    for r in (4, 16, 64):
        add(f"rank{r}", f"lora.rank={r}")
