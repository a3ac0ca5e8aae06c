"""`memllm memory ...`: create, add, import, export, query, delete, stats and show a memory directory.

    memllm memory create DIR [--encoder minilm|hash:384|/path/to/hf_bert]
    memllm memory add DIR "Subject>>relation>>Object" ... [--source doc1] [--replace]
    memllm memory import DIR triples.jsonl [--replace]
    memllm memory export DIR triples.jsonl
    memllm memory query DIR "Subject>>relation>>" ">>relation>>Object" "Subject>>>>" [--editing] [--tau-e X]
    memllm memory delete DIR [--triple S>>r>>O] [--entity NAME] [--relation NAME]
    memllm memory stats DIR
    memllm memory show DIR ENTITY
    memllm memory write --model MODEL --corpus FILE --memory DIR   (the memory-write model: memllm_jax/decode/write_cli.py)
        [--process-index I --process-count N]                     (one shard of a bulk write)
    memllm memory merge OUT SHARD...                              (join the shards: memllm_jax/decode/merge_cli.py)

Queries with exactly one of subject / object given are the paper's object / subject queries (entities back);
patterns with one or two slots of any kind use the RET-LLM form (whole triples back).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shutil

from memllm_jax import options, protocol


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True)
    p = sub.add_parser("create", help="create an empty memory directory")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("--encoder", default="minilm", help='"minilm", "hash:DIM" or a local HF BERT directory')
    p = sub.add_parser("add", help="add triples given as S>>r>>O")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("triples", nargs="+")
    p.add_argument("--source", default="cli")
    p.add_argument("--replace", action="store_true", help="replace the objects of matching (subject, relation)")
    p = sub.add_parser("import", help="add the triples of a JSONL file")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("file", type=pathlib.Path)
    p.add_argument("--replace", action="store_true")
    p = sub.add_parser("export", help="write every triple with provenance as JSONL")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("file", type=pathlib.Path)
    p = sub.add_parser("query", help='query with "S>>r>>", ">>r>>O" or RET-LLM patterns')
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("patterns", nargs="+")
    p.add_argument("--editing", action="store_true", help="editing thresholds (tau_e .85, tau_t .2, tau_r .6)")
    p.add_argument("--tau-e", type=options.cosine, help="entity similarity threshold (default: the memory's)")
    p.add_argument("--tau-t", type=options.cosine, help="relation similarity threshold (default: the memory's)")
    p.add_argument("--tau-r", type=options.cosine, help="triple similarity threshold (default: the memory's)")
    p.add_argument("--q-thr", type=options.positive_int,
                   help="report result sets with more entities as too large (default: the memory's)")
    p.add_argument("--exact-first", action="store_true", help="return only exact-name hits when there are any")
    p = sub.add_parser("delete", help="delete triples, entities or relations")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("--triple", action="append", default=[])
    p.add_argument("--entity", action="append", default=[])
    p.add_argument("--relation", action="append", default=[])
    p = sub.add_parser("stats", help="counts, bytes and the records-per-triple ratio (paper Figure 4)")
    p.add_argument("dir", type=pathlib.Path)
    p = sub.add_parser("show", help="the triples around an entity")
    p.add_argument("dir", type=pathlib.Path)
    p.add_argument("entity")


def _open(directory: pathlib.Path):
    from memllm_jax.memory import TripleMemory, load_encoder
    from memllm_jax.memory.files import read_manifest

    return TripleMemory.open(directory, load_encoder(read_manifest(directory)["encoder"]))


def _split(pattern: str) -> list[str | None]:
    fields = protocol._split_unescaped(pattern, protocol.FIELD_SEP)
    if len(fields) != 3:
        raise SystemExit(f"pattern {pattern!r}: expected S>>r>>O with empty slots for unknowns")
    return [protocol.unescape_text(f).strip() or None for f in fields]


def _triple(pattern: str) -> protocol.Triple:
    fields = _split(pattern)
    if not all(fields):
        raise SystemExit(f"triple {pattern!r}: subject, relation and object are all required")
    return protocol.Triple(*fields)  # type: ignore[arg-type]


def main(args: argparse.Namespace) -> int:
    from memllm_jax.config import EDITING_MEMORY, MemoryConfig
    from memllm_jax.errors import InputError
    from memllm_jax.memory import TripleMemory, load_encoder
    from memllm_jax.memory.encoder import check_encoder_spec

    # bad input (MemoryFileError, MemoryInputError) is reported by memllm_jax.cli: one line, exit 2
    if args.action == "create":
        if (args.dir / "CURRENT").exists():
            raise SystemExit(f"{args.dir}: a memory already exists there")
        try:
            check_encoder_spec(args.encoder)
        except InputError as exc:
            raise SystemExit(f"--encoder {exc}") from exc
        created = not args.dir.exists()
        try:
            TripleMemory(load_encoder(args.encoder), MemoryConfig(encoder=args.encoder)).save(args.dir)
        except BaseException:
            if created:  # a failed create leaves no folder behind
                shutil.rmtree(args.dir, ignore_errors=True)
            raise
        print(f"created {args.dir}")
        return 0
    mem = _open(args.dir)
    if args.action == "add":
        ids = mem.add([_triple(t) for t in args.triples], source=args.source, replace=args.replace)
        mem.save(args.dir)
        print(json.dumps({"ids": ids}))
    elif args.action == "import":
        n = mem.import_jsonl(args.file, replace=args.replace)
        mem.save(args.dir)
        print(f"imported {n} triples; memory has {mem.stats()['triples']}")
    elif args.action == "export":
        print(f"exported {mem.export_jsonl(args.file)} triples to {args.file}")
    elif args.action == "query":
        cfg = EDITING_MEMORY if args.editing else mem.config
        changes = {k: v for k, v in (("tau_entity", args.tau_e), ("tau_relation", args.tau_t),
                                     ("tau_result", args.tau_r), ("q_thr", args.q_thr)) if v is not None}
        cfg = dataclasses.replace(cfg, exact_match_priority=args.exact_first or cfg.exact_match_priority, **changes)
        for pattern in args.patterns:
            s, r, o = _split(pattern)
            if r is not None and (s is None) != (o is None):
                res = mem.query([protocol.Query(s, r, o)], cfg)[0]
                print(json.dumps({"query": pattern, "entities": res.entities,
                                  "scores": [round(x, 4) for x in res.scores], "too_large": res.too_large},
                                 ensure_ascii=False))
            else:
                hits = mem.match(s, r, o, cfg)
                print(json.dumps({"query": pattern, "triples": [[t.subject, t.relation, t.object, round(x, 4)]
                                                                for t, x in hits]}, ensure_ascii=False))
    elif args.action == "delete":
        n = mem.delete_triples([_triple(t) for t in args.triple])
        n += sum(mem.delete_entity(e) for e in args.entity)
        n += sum(mem.delete_relation(r) for r in args.relation)
        mem.save(args.dir)
        print(f"deleted {n} triples")
    elif args.action == "stats":
        print(json.dumps(mem.stats(), indent=1))
    elif args.action == "show":
        for t in mem.show(args.entity):
            print(protocol.format_triple(t))
    return 0
