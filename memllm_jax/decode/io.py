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
    from memllm_jax.errors import InputError, load_json
    from memllm_jax.model.gguf import resolve_model_dir

    path = resolve_model_dir(path)
    run_config = path / "train_config.json"
    if not run_config.exists() and not (path / "config.json").exists():  # before importing jax: fail fast
        raise InputError(f"{path}: neither an HF-format model directory (config.json) nor a training run "
                         f"(train_config.json)")
    from memllm_jax.model.hf import load_hf
    from memllm_jax.tokenizer import load_tokenizer

    if run_config.exists():
        from memllm_jax.train.loop import load_trained_model

        run = load_json(run_config)
        tok_path = tokenizer or (run.get("tokenizer") if isinstance(run, dict) else None)
        if not isinstance(tok_path, str) or not tok_path:
            raise InputError(f"{run_config}: field tokenizer: missing (or pass --tokenizer)")
        model = load_trained_model(str(path))
        tok, cfg = load_tokenizer(tok_path), model.cfg
    else:
        hf_cfg = load_json(path / "config.json")  # a damaged config names itself before the tokenizer reads it
        tok = load_tokenizer(tokenizer or path)
        # A base model's tokenizer gets the API markers added: append their rows (mean init), as training does.
        hf_vocab = hf_cfg.get("vocab_size", tok.vocab_size) if isinstance(hf_cfg, dict) else tok.vocab_size
        cfg, model = load_hf(path, extra_tokens=max(0, tok.vocab_size - int(hf_vocab)))
    if tok.vocab_size > cfg.vocab_size:
        raise InputError(f"{tokenizer or path}: tokenizer has {tok.vocab_size} ids but the model only "
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
        from memllm_jax.errors import InputError

        raise InputError(f"{directory}: no memory there (create one with `memllm memory create`)")
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
