"""Test helpers: tiny random HF torch Mistral models written to a directory, their logits, padded batches."""

from __future__ import annotations

import pathlib

import numpy as np

from memllm_jax.bench.model import hf_mistral
from memllm_jax.config import ModelConfig


def save_hf_mistral(cfg: ModelConfig, directory: str | pathlib.Path, seed: int = 0, **save_kwargs):
    """Create `hf_mistral(cfg, seed)`, save it with `save_pretrained` and return it."""
    model = hf_mistral(cfg, seed)
    model.save_pretrained(str(directory), **save_kwargs)
    return model


def hf_logits(model, tokens_BxL: np.ndarray, positions_BxL: np.ndarray, mask_BxL: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        out = model(
            input_ids=torch.as_tensor(np.asarray(tokens_BxL), dtype=torch.long),
            position_ids=torch.as_tensor(np.asarray(positions_BxL), dtype=torch.long),
            attention_mask=torch.as_tensor(np.asarray(mask_BxL), dtype=torch.long),
        )
    return out.logits.float().numpy()


def padded_batch(rng: np.random.Generator, vocab: int, batch: int, length: int, left_pad: int = 0, right_pad: int = 0):
    """tokens, positions, mask: row 0 full, row 1 left-padded by `left_pad`, row 2 right-padded by `right_pad`."""
    tokens = rng.integers(0, vocab, (batch, length)).astype(np.int32)
    mask = np.ones((batch, length), bool)
    if batch > 1 and left_pad:
        mask[1, :left_pad] = False
    if batch > 2 and right_pad:
        mask[2, length - right_pad:] = False
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return tokens, positions, mask


def layer_param(model, i: int, *path: str):
    """The array of parameter `path` (e.g. "attn", "q", "kernel") of decoder layer i, scanned or not."""
    node = model.layers if model.cfg.scan_layers else model.layers[i]
    for name in path:
        node = getattr(node, name)
    value = node[...]
    return value[i] if model.cfg.scan_layers else value
