"""Merging memories: one memory holding the triples of several, as if they had all been added to one memory in
a given order (used to join the shards of a bulk write, `memllm memory merge`)."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from memllm_jax.memory.store import MemoryInputError, TripleMemory
from memllm_jax.protocol import Triple


def merge(memories: Sequence[TripleMemory], order: Callable[[dict, int], Any] | None = None) -> TripleMemory:
    """A new memory with every stored triple of `memories` and its provenance.

    The triples are added in the order of `order(record, position)` (`record` from `TripleMemory.records()`,
    `position` the memory's index in `memories`; default `(position, seq)`: memory after memory, each in its
    insertion order), so a triple stored in several memories keeps the provenance of the first, as `add`
    de-duplicates, and ids and `seq` number the merged order. Embeddings are copied from the memories, not
    recomputed; entities and relations no triple uses are not carried over. All memories must share one
    encoder (name and dimension); the result takes the first memory's config."""
    if not memories:
        raise MemoryInputError("merge: no memories given")
    first = memories[0]
    for k, mem in enumerate(memories[1:], 1):
        if (mem.encoder.name, mem.encoder.dim) != (first.encoder.name, first.encoder.dim):
            raise MemoryInputError(f"merge: memory {k} uses encoder {mem.encoder.name} ({mem.encoder.dim}-d), memory 0 "
                                   f"{first.encoder.name} ({first.encoder.dim}-d)")
    order = order or (lambda record, position: (position, record["seq"]))
    entries = sorted(((pos, r) for pos, mem in enumerate(memories) for r in mem.records()),
                     key=lambda e: (order(e[1], e[0]), e[0], e[1]["seq"]))
    out = TripleMemory(first.encoder, first.config)
    # names in order of first use (as one memory adding these triples in this order numbers them), with the
    # embeddings of the memory that holds them
    for table, fields in (("entities", ("subject", "object")), ("relations", ("relation",))):
        names: dict[str, TripleMemory] = {}
        for pos, r in entries:
            for f in fields:
                names.setdefault(r[f], memories[pos])
        if names:
            vecs = np.stack([getattr(m, table).vector(getattr(m, table).ids[n]) for n, m in names.items()])
            getattr(out, table).add(list(names), vecs.astype(np.float32))
    if entries:
        out.add([Triple(r["subject"], r["relation"], r["object"]) for _, r in entries],
                source=[r["source"] for _, r in entries])
    return out
