"""Opening what the decode commands need besides the model (`memllm_jax.model.load`): a memory directory."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence


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
