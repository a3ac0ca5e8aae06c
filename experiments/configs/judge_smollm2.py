"""The judge LoRA adapter on the pretrained SmolLM2-135M base: given the text up to a sentence and one candidate
triple, answer " yes" when the triple is one of the document's facts by its gold names, else " no" (the loss on
that one token; `data_gen.judge_examples`). A document's examples share its text as a token prefix, laid out once
("pack_prefixes"): on Re-DocRED's 400 training documents 26,396 examples fill 228 batches of 8 x 512 tokens.
After these 100 steps it ranks the Re-DocRED writer's triples with AUC 0.71-0.74 against 0.66 for the writer's
own confidence (docs/decode.md, "A judge of written triples"): too weak a filter to be on in any config."""

import dataclasses

from experiments.configs import mw_smollm2
from memllm_jax.train.config import TrainConfig


def get_config() -> TrainConfig:
    """The memory-write adapter's settings (`mw_smollm2`: LoRA r16 on every linear layer, lr 1e-3, cosine) with
    the judge's data, rows of 512 tokens and its own steps; no API marker is used, so none is trained."""
    return dataclasses.replace(
        mw_smollm2.get_config(),
        name="judge_smollm2",
        train_markers=False,
        train_data=("runs/smollm2_redocred/data/train/judge.jsonl",),
        tokenizer="runs/smollm2_redocred/tokenizer",
        eval_max_examples=256,
        seq_len=512,
        buckets=(256, 512),
        micro_batches=2,
        steps=100,
        warmup_steps=5,
        checkpoint_every=25,
        workdir="runs/smollm2_redocred/train/judge",
    )
