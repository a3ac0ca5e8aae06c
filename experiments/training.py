"""Load the pipeline's trained models back."""

from __future__ import annotations

import pathlib


def load_trained(workdir: str | pathlib.Path, vocab_size: int | None = None):
    """The model at `workdir` (a training workdir, model checkpoint, HF directory or .gguf; LoRA merged). For an
    HF base, `vocab_size` is the tokenizer's: rows for the added API markers are appended."""
    from memllm_jax.sources import open_model

    return open_model(str(workdir), vocab_size=vocab_size)[0]
