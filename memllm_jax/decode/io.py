"""Loading what the decode commands need: a model with its tokenizer, and a memory directory."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence


def load_model(path: str | pathlib.Path, tokenizer: str | pathlib.Path | None = None):
    """`(model, tokenizer)` from any model path `memllm_jax.sources.identify` knows (model checkpoint, training
    workdir, HF directory, `.gguf` file); LoRA merged. The tokenizer is `tokenizer`, else the one stored with
    the model (`<checkpoint>/tokenizer`, the run's `tokenizer`, the HF directory's own). One line on stderr says
    what was found."""
    from memllm_jax.errors import InputError
    from memllm_jax.sources import identify

    src = identify(path)  # before importing jax: a wrong path fails fast
    if src.kind == "HF":
        from memllm_jax.errors import load_json

        load_json(src.weights / "config.json")  # a damaged config names itself before the tokenizer reads it
    tok_path = tokenizer or src.tokenizer
    if not tok_path:
        raise InputError(f"{path}: no tokenizer stored with this {src.kind} model; pass --tokenizer")
    from memllm_jax.sources import open_model
    from memllm_jax.tokenizer import load_tokenizer

    tok = load_tokenizer(tok_path)
    model, _ = open_model(path, tokenizer=tok_path, vocab_size=tok.vocab_size)
    if tok.vocab_size > model.cfg.vocab_size:
        raise InputError(f"{tok_path}: tokenizer has {tok.vocab_size} ids but the model {path} only "
                         f"{model.cfg.vocab_size}")
    return model, tok


def check_memory(directory: str | pathlib.Path, encoder: str = "minilm", create: bool = True) -> None:
    """What `open_memory` would refuse, checked without loading anything (before a model loads): `directory` is
    a readable memory, or (when `create`) a folder a new memory with a valid `encoder` can be written to."""
    from memllm_jax.errors import InputError
    from memllm_jax.files import check_writable
    from memllm_jax.memory.encoder import check_encoder_spec
    from memllm_jax.memory.files import read_manifest

    directory = pathlib.Path(directory)
    if (directory / "CURRENT").exists():
        read_manifest(directory)
    elif not create:
        if directory.exists() and not directory.is_dir():
            raise InputError(f"{directory}: not a directory (expected a memory directory)")
        raise InputError(f"{directory}: no memory there (create one with `memllm memory create`)")
    else:
        check_writable(directory, directory=True)
        try:
            check_encoder_spec(encoder)
        except InputError as exc:
            raise InputError(f"--encoder {exc}") from exc


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
