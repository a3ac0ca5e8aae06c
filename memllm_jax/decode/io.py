"""Loading what the decode commands need: a model with its tokenizer, and a memory directory."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence


def load_model(path: str | pathlib.Path, tokenizer: str | pathlib.Path | None = None):
    """`(model, tokenizer)` from an HF-format Mistral directory (as written by `memllm convert` /
    `save_hf`; tokenizer from `tokenizer` or the same directory), a `.gguf` file (converted once to such a
    directory) or from a finished training run directory (`train_config.json` + `params/`; LoRA merged;
    tokenizer from `tokenizer` or the run's config)."""
    import json

    from memllm_jax.model.gguf import resolve_model_dir
    from memllm_jax.model.hf import load_hf
    from memllm_jax.tokenizer import load_tokenizer

    path = resolve_model_dir(path)
    if (path / "train_config.json").exists():
        from memllm_jax.train.loop import load_trained_model

        try:
            tok_path = tokenizer or json.loads((path / "train_config.json").read_text(encoding="utf-8"))["tokenizer"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise SystemExit(f"{path / 'train_config.json'}: field tokenizer: unreadable ({exc})") from exc
        model = load_trained_model(str(path))
        tok, cfg = load_tokenizer(tok_path), model.cfg
    elif (path / "config.json").exists():
        tok = load_tokenizer(tokenizer or path)
        # A base model's tokenizer gets the API markers added: append their rows (mean init), as training does.
        hf_cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        hf_vocab = int(hf_cfg.get("vocab_size", tok.vocab_size))
        cfg, model = load_hf(path, extra_tokens=max(0, tok.vocab_size - hf_vocab))
    else:
        raise SystemExit(f"{path}: neither an HF-format model directory (config.json) nor a training run "
                         f"(train_config.json)")
    if tok.vocab_size > cfg.vocab_size:
        raise SystemExit(f"{tokenizer or path}: tokenizer has {tok.vocab_size} ids but the model only "
                         f"{cfg.vocab_size} (config.json field vocab_size)")
    return model, tok


def open_memory(directory: str | pathlib.Path, encoder: str = "minilm", create: bool = True):
    """Open the memory in `directory`, or (when `create`) start an empty one with `encoder`."""
    from memllm_jax.config import MemoryConfig
    from memllm_jax.memory import TripleMemory, load_encoder
    from memllm_jax.memory.files import read_manifest

    directory = pathlib.Path(directory)
    if (directory / "CURRENT").exists():
        return TripleMemory.open(directory, load_encoder(read_manifest(directory)["encoder"]))
    if not create:
        raise SystemExit(f"{directory}: no memory there (create one with `memllm memory create`)")
    return TripleMemory(load_encoder(encoder), MemoryConfig(encoder=encoder))


@dataclasses.dataclass
class _Empty:
    entities: list
    too_large: bool = False
    scores: list = dataclasses.field(default_factory=list)


class NoMemory:
    """Answers every query with nothing (generation without a memory directory)."""

    def query(self, queries: Sequence) -> list[_Empty]:
        return [_Empty([]) for _ in queries]
