"""`memllm data build`: stream a DocRED-format corpus into write / read / eval / lm example files.

Every output is written atomically (temp file, then `os.replace` when the whole build succeeded), so a
malformed document stops the build with an error naming the file, document and field and leaves no
partial output. Documents are streamed; only the gold lookup (one pass) and, for counterfactual variants,
the raw corpus are held in memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
import time
from typing import Callable, Iterable, Iterator, Mapping

from data_gen.docred import Document, documents_from_raw, iter_documents
from data_gen.eval_examples import eval_record
from data_gen.io import JsonlWriter, iter_json_array
from memllm_jax.files import atomic_open
from data_gen.recipes import ReadRecipe, WriteRecipe
from data_gen.read_examples import (absent_question_records, context_free_records, misread, question_form_records,
                                   read_records, scan_read_points)
from data_gen.stats import Stats
from data_gen.two_hop import two_hop_records
from data_gen.write_examples import (context_free_items, iter_write_items, lone_phrase_items, question_form_items,
                                     write_coverage, write_record)
from memllm_jax import protocol as P


KINDS = ("write", "read", "eval", "lm")
"""The kinds of examples `build_all` builds, each into `<kind>.jsonl` (or `.array_record`), plus `coverage.jsonl`
with the write examples and `stats.json`; a build removes these files left by an earlier build into the same
folder that it did not write itself, so the folder holds one build."""


class ArrayRecordOut:
    """Atomic ArrayRecord writer of JSON records (grain's `ArrayRecordDataSource` reads it)."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.count = 0

    def __enter__(self):
        from array_record.python.array_record_module import ArrayRecordWriter  # noqa: PLC0415

        fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=self.path.parent)
        os.close(fd)
        self._w = ArrayRecordWriter(self.tmp, "group_size:1")
        return self

    def write(self, record: dict) -> None:
        self._w.write(json.dumps(record, ensure_ascii=False).encode("utf-8"))
        self.count += 1

    def __exit__(self, exc_type, *rest):
        self._w.close()
        if exc_type is None:
            os.chmod(self.tmp, 0o644)
            os.replace(self.tmp, self.path)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.tmp)
        return False


def lm_record(doc: Document) -> dict:
    return {"kind": "lm", "doc": doc.doc_id, "segments": [{"text": P.escape_text(doc.text), "loss": True}], "eos": True}


def build_document(doc: Document, kinds: set[str], query_fn, stats: Stats, write: WriteRecipe, read: ReadRecipe,
                   seed: int = 0) -> Iterator[tuple[str, dict]]:
    """The `kinds` of examples of one document, as `(kind, record)`; extra write / read examples are marked
    `"context_free"` / `"question_form"` / `"absent"` / `"two_hop"` (`WriteRecipe`, `ReadRecipe`)."""
    stats.documents += 1
    if "write" in kinds:
        for item in iter_write_items(doc, write.pretext_sentences, write.evidence):
            rec = write_record(doc, item)
            stats.add_write(rec)
            yield "write", rec
        lone = context_free_items(doc, write.context_free, seed, write.evidence)
        lone += lone_phrase_items(doc, write.lone_phrases, seed, write.evidence, skip=[i.sent_id for i in lone])
        for item in lone:
            rec = {**write_record(doc, item), "context_free": True}
            stats.add_write(rec)
            yield "write", rec
        for item in question_form_items(doc, write.question_form, seed, write.evidence):
            rec = {**write_record(doc, item), "question_form": True}
            stats.add_write(rec)
            yield "write", rec
        cov = write_coverage(doc, write.pretext_sentences, write.evidence)
        stats.add_coverage(cov)
        for c in cov:
            if not c["sentences"]:
                yield "coverage", {"doc": doc.doc_id, **c}
    if "read" in kinds:
        points = scan_read_points(doc, query_fn, q_thr=read.q_thr, max_queries=read.max_queries,
                                  filter_ambiguous=read.filter_ambiguous)
        stats.misread_results += misread(doc, points, read.misread_rate, seed)
        stats.add_read_points(points)
        for rec in read_records(doc, points):
            yield "read", rec
        lone = context_free_records(doc, query_fn, read.context_free, seed, read.misread_rate, q_thr=read.q_thr,
                                    max_queries=read.max_queries, filter_ambiguous=read.filter_ambiguous)
        stats.read_examples += len(lone)
        stats.context_free_reads += len(lone)
        stats.misread_results += sum(rec["misread"] for rec in lone)
        for rec in lone:
            yield "read", rec
        for rec in question_form_records(doc, read.question_form, seed):
            stats.read_examples += 1
            stats.question_form_reads += 1
            yield "read", rec
        for rec in absent_question_records(doc, read.absent_questions, seed, query_fn, read.absent_form):
            stats.read_examples += 1
            stats.absent_reads += 1
            yield "read", rec
        for rec in two_hop_records(doc, read.two_hop, seed, keep_reads=read.keep_reads,
                                   distractors=read.two_hop_distractors):
            stats.read_examples += 1
            stats.two_hop_reads += rec["two_hop"] == 1
            yield "read", rec
    if "eval" in kinds:
        rec = eval_record(doc, max_queries=read.max_queries, filter_ambiguous=read.filter_ambiguous)
        stats.add_eval(rec)
        yield "eval", rec
    if "lm" in kinds:
        yield "lm", lm_record(doc)


def build_all(input_path: str, out_dir: str, labels: Mapping[str, str], *, kinds: set[str],
              write: WriteRecipe = WriteRecipe(), read: ReadRecipe = ReadRecipe(),
              query_fn_factory: Callable[[Callable[[], Iterable[Document]]], object] | None = None,
              fmt: str = "jsonl", limit: int | None = None, seed: int = 0) -> Stats:
    """Build the `kinds` of examples from `input_path` into `out_dir` by the recipes; `write.counterfactual` /
    `read.counterfactual` counterfactual variants of every document (`data_gen.counterfactual`, paper §4.1) add
    to the write / read examples, each record marked with its `"variant"`. Reads are answered from the corpus's
    gold triples unless `query_fn_factory` gives another memory. After a successful build, the example files of an
    earlier build in `out_dir` that this one did not write are removed (see KINDS)."""
    out = pathlib.Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _build_all(input_path, out, labels, kinds, write, read, query_fn_factory, fmt, limit, seed)
    except BaseException:
        if created:  # the writers removed their temp files; leave no empty output directory either
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _build_all(input_path: str, out: pathlib.Path, labels: Mapping[str, str], kinds: set[str], write: WriteRecipe,
               read: ReadRecipe, query_fn_factory, fmt: str, limit: int | None, seed: int) -> Stats:
    t0 = time.perf_counter()
    streams: list[tuple[int | None, set[str], Callable[[], Iterator[Document]]]] = [
        (None, kinds, lambda: iter_documents(input_path, labels, limit))]
    variants = {"write": write.counterfactual, "read": read.counterfactual}
    if any(variants[k] for k in kinds & variants.keys()):
        from data_gen.counterfactual import name_pools, permutation, replace_entities  # noqa: PLC0415

        raw = [d for i, d in zip(range(limit if limit is not None else 1 << 62), iter_json_array(input_path))]
        list(documents_from_raw(raw, labels, input_path))  # validate before building variants
        pools = name_pools(raw)
        for v in range(max(variants[k] for k in kinds & variants.keys())):
            mapping = permutation(pools, seed, v)
            streams.append((v, {k for k in kinds & variants.keys() if v < variants[k]},
                            lambda m=mapping: documents_from_raw((replace_entities(d, m) for d in raw), labels,
                                                                 f"{input_path} (counterfactual)")))
    names = sorted(kinds) + (["coverage"] if "write" in kinds else [])
    suffix = ".array_record" if fmt == "arrayrecord" else ".jsonl"
    stats = Stats()
    with contextlib.ExitStack() as stack:
        writers = {k: stack.enter_context(ArrayRecordOut(out / f"{k}{suffix}") if fmt == "arrayrecord" and k != "coverage"
                                          else JsonlWriter(out / f"{k}.jsonl")) for k in names}
        for variant, doc_kinds, factory in streams:
            query_fn = None
            if "read" in doc_kinds:
                query_fn = query_fn_factory(factory) if query_fn_factory is not None else _gold(factory)
            for doc in factory():
                for kind, rec in build_document(doc, doc_kinds, query_fn, stats, write, read, seed):
                    if variant is not None:
                        rec["variant"] = variant
                    writers[kind].write(rec)
        stats.seconds = time.perf_counter() - t0
        with atomic_open(out / "stats.json") as f:
            json.dump(stats.to_json(), f, indent=1)
    written = {w.path.name for w in writers.values()}
    for kind in KINDS + ("coverage",):  # an earlier build's outputs this one did not replace
        for stale in (out / f"{kind}.jsonl", out / f"{kind}.array_record"):
            if stale.name not in written:
                stale.unlink(missing_ok=True)
    return stats


def _gold(factory):
    from data_gen.gold_memory import GoldLookup  # noqa: PLC0415

    return GoldLookup().add_documents(factory())
