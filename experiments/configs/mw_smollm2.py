"""The memory-write LoRA adapter on the pretrained SmolLM2-135M base (loss on the `({MEM_WRITE-->...})` span),
sized for a 2-core CPU: LoRA r 16 on every linear layer, the API markers' embedding rows trained, whole
examples packed into rows of 256 tokens, the prefix a document's examples share laid out once ("pack_prefixes",
docs/train.md: the same steps train on ~1.2x more write examples, ~1.4x more read examples). SmolLM2 already
copies names from its context, so a few hundred examples teach it the call format and the relation labels; the
writer's precision still rises between steps 72 and 96 (docs/eval.md, "Memory-write learning curve").
`smollm2_redocred` overrides the steps, lengths and packing."""

from memllm_jax.config import SMOLLM2_135M, LoraConfig
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    return TrainConfig(
        name="mw_smollm2",
        model=SMOLLM2_135M,
        mode="lora",
        train_markers=True,
        lora=LoraConfig(rank=16, alpha=32.0, dropout=0.0),
        train_data=("runs/default/data/train/write.jsonl",),
        tokenizer="runs/default/tokenizer",
        eval_fraction=0.02,
        eval_max_examples=48,
        seq_len=256,
        packing="pack_prefixes",
        buckets=(128, 256),
        global_batch=8,
        steps=96,
        epochs=None,
        lr=1e-3,
        warmup_steps=3,
        schedule="cosine",
        end_lr_fraction=0.1,
        weight_decay=0.0,
        clip_norm=1.0,
        eval_every=0,
        eval_batch=16,
        log_every=5,
        checkpoint_every=0,
        workdir="runs/default/train/mw",
        compilation_cache=".xla_cache",
    )


def sweep(add) -> None:
    for steps in (48, 96, 144):
        add(f"steps{steps}", f"steps={steps}")
    for lr in (3e-4, 1e-3, 2e-3):
        add(f"lr{lr:g}", f"lr={lr}")
