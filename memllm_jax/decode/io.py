"""Opening what the decode commands need besides the model (`memllm_jax.model.load`): a memory directory."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence


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
