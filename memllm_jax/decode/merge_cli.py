"""`memllm memory merge OUT SHARD...`: join the shards of a bulk `memllm memory write` into one memory.

    memllm memory merge mem mem.shard0 mem.shard1 ... [--allow-partial]

The shards are the memory directories of `memllm memory write ... --process-index I --process-count N`, I =
0..N-1, on one corpus; each must have finished its documents (`write_progress.json`), unless
`--allow-partial`. The result equals the memory one process writing the whole corpus would have produced: the
same triples with the same provenance (`doc_id/sentence`), added in the same order (by document index, then
sentence, then the order within the call), so also the same ids, `seq` and entity / relation tables; a
triple written from several documents keeps the first document's provenance. OUT also gets the merged
`write_progress.json`, so `memllm memory write --memory OUT` on the same corpus finds nothing left to do.

Directories without `write_progress.json` (memories made otherwise) are merged as a plain union, in the order
given, each in its insertion order.
"""

from __future__ import annotations

import argparse
import json
import pathlib

from memllm_jax.decode.write_cli import PROGRESS, CorpusError, read_progress, source_order
from memllm_jax.files import atomic_write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", type=pathlib.Path, help="the merged memory directory (must not hold a memory)")
    parser.add_argument("shards", type=pathlib.Path, nargs="+", help="memory directories to merge")
    parser.add_argument("--allow-partial", action="store_true", help="merge shards that have not finished")


def _check_shards(shards: list[pathlib.Path], allow_partial: bool) -> list[dict] | None:
    """The shards' progress records, checked to be the complete set of one sharded write; None when no shard
    has one (a plain union)."""
    has = [(d / PROGRESS).exists() for d in shards]
    if not any(has):
        return None
    if not all(has):
        d = shards[has.index(False)]
        raise CorpusError(f"{d}: no {PROGRESS} (not a `memllm memory write` shard), unlike {shards[has.index(True)]}")
    states = [read_progress(d / PROGRESS) for d in shards]
    corpus, count = states[0]["corpus"], states[0]["shard"][1]
    seen: dict[int, pathlib.Path] = {}
    for d, state in zip(shards, states):
        where = d / PROGRESS
        if state["corpus"] != corpus:
            raise CorpusError(f"{where}: field corpus: {state['corpus']}, but {shards[0]} wrote {corpus}")
        index, n = state["shard"]
        if n != count:
            raise CorpusError(f"{where}: field shard: shard {index} of {n}, but {shards[0]} is one of {count}")
        if index in seen:
            raise CorpusError(f"{where}: field shard: shard {index} of {n} again (also {seen[index]})")
        seen[index] = d
        total = state.get("total")
        if total is not None and len(state["done"]) < total and not allow_partial:
            raise CorpusError(f"{d}: shard {index} of {n} has written {len(state['done'])} of its {total} documents "
                              f"(finish it with the same `memllm memory write` command, or --allow-partial)")
    missing = sorted(set(range(count)) - set(seen))
    if missing and not allow_partial:
        raise CorpusError(f"{shards[0]}: shards {missing} of {count} are missing (give all {count} shard directories, "
                          f"or --allow-partial)")
    return states


def _write_order(record: dict, position: int):
    at = source_order(record["source"])
    # other sources (a memory the shards started from) first, shard by shard; then the corpus order
    return (0, position, 0) if at is None else (1, *at)


def main(args: argparse.Namespace) -> int:
    from memllm_jax.memory import TripleMemory, load_encoder
    from memllm_jax.memory.files import read_manifest
    from memllm_jax.memory.merge import merge

    if (args.out / "CURRENT").exists():
        raise SystemExit(f"{args.out}: a memory already exists there (merge into a new directory)")
    encoders: dict[str, object] = {}
    memories = []
    for d in args.shards:
        name = read_manifest(d)["encoder"]  # names the directory when it is not a memory
        if name not in encoders:
            encoders[name] = load_encoder(name)
        memories.append(TripleMemory.open(d, encoders[name]))
    states = _check_shards(list(args.shards), args.allow_partial)
    merged = merge(memories, _write_order if states is not None else None)
    merged.save(args.out)
    if states is not None:
        done = sorted({doc for s in states for doc in s["done"]})
        totals = [s.get("total") for s in states]
        atomic_write_json(args.out / PROGRESS, {"corpus": states[0]["corpus"], "shard": [0, 1], "done": done,
                                           **({"total": sum(totals)} if None not in totals else {})})
    print(json.dumps({"shards": len(memories), "triples": len(merged.triples), "entities": len(merged.entities),
                      "relations": len(merged.relations),
                      "duplicates": sum(len(m.triples) for m in memories) - len(merged.triples)}))
    return 0
