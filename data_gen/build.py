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
from typing import Callable, Collection, Iterable, Iterator, Mapping

from data_gen.docred import Document, documents_from_raw, iter_documents
from data_gen.eval_examples import eval_record
from data_gen.io import JsonlWriter, iter_json_array
from memllm_jax.files import atomic_open
from data_gen.read_examples import context_free_records, misread, question_form_records, read_records, scan_read_points
from data_gen.stats import Stats
from data_gen.write_examples import (context_free_items, iter_write_items, question_form_items, write_coverage,
                                     write_record)
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


def build_document(doc: Document, kinds: set[str], query_fn, stats: Stats, *, pretext_sentences: int | None,
                   q_thr: int, max_queries: int, filter_ambiguous: bool, context_free: int = 0,
                   read_context_free: int = 0, question_form: int = 0, read_question_form: int = 0,
                   misread_rate: float = 0.0, write_evidence: bool = False, seed: int = 0) -> Iterator[tuple[str, dict]]:
    """`context_free`: extra write examples per document of one later sentence without its pretext
    (`write_examples.context_free_items`), marked `"context_free": true`; `read_context_free`: the same for read
    examples (`read_examples.context_free_records`); `question_form`: extra write examples per document of one
    triple asked as a question and answered (`write_examples.question_form_items`), marked `"question_form": true`;
    `read_question_form`: the same as read examples (`read_examples.question_form_records`); `misread_rate`: the
    share of the read examples' query results replaced by a wrong entity (`read_examples.misread`);
    `write_evidence`: a write example's targets are only the triples its sentence is evidence for
    (`write_examples`, "Evidence")."""
    stats.documents += 1
    if "write" in kinds:
        for item in iter_write_items(doc, pretext_sentences, write_evidence):
            rec = write_record(doc, item)
            stats.add_write(rec)
            yield "write", rec
        for item in context_free_items(doc, context_free, seed, write_evidence):
            rec = {**write_record(doc, item), "context_free": True}
            stats.add_write(rec)
            yield "write", rec
        for item in question_form_items(doc, question_form, seed, write_evidence):
            rec = {**write_record(doc, item), "question_form": True}
            stats.add_write(rec)
            yield "write", rec
        cov = write_coverage(doc, pretext_sentences, write_evidence)
        stats.add_coverage(cov)
        for c in cov:
            if not c["sentences"]:
                yield "coverage", {"doc": doc.doc_id, **c}
    if "read" in kinds:
        points = scan_read_points(doc, query_fn, q_thr=q_thr, max_queries=max_queries, filter_ambiguous=filter_ambiguous)
        stats.misread_results += misread(doc, points, misread_rate, seed)
        stats.add_read_points(points)
        for rec in read_records(doc, points):
            yield "read", rec
        lone = context_free_records(doc, query_fn, read_context_free, seed, misread_rate, q_thr=q_thr,
                                    max_queries=max_queries, filter_ambiguous=filter_ambiguous)
        stats.read_examples += len(lone)
        stats.context_free_reads += len(lone)
        stats.misread_results += sum(rec["misread"] for rec in lone)
        for rec in lone:
            yield "read", rec
        for rec in question_form_records(doc, read_question_form, seed):
            stats.read_examples += 1
            stats.question_form_reads += 1
            yield "read", rec
    if "eval" in kinds:
        rec = eval_record(doc, max_queries=max_queries, filter_ambiguous=filter_ambiguous)
        stats.add_eval(rec)
        yield "eval", rec
    if "lm" in kinds:
        yield "lm", lm_record(doc)


def build_all(input_path: str, out_dir: str, labels: Mapping[str, str], *, kinds: set[str], memory: str = "gold",
              query_fn_factory: Callable[[Callable[[], Iterable[Document]]], object] | None = None,
              pretext_sentences: int | None = 10, q_thr: int = 30, max_queries: int = 3, filter_ambiguous: bool = True,
              counterfactual: int = 0, counterfactual_kinds: Collection[str] | None = None, context_free: int = 0,
              read_context_free: int = 0, question_form: int = 0, read_question_form: int = 0,
              misread_rate: float = 0.0, write_evidence: bool = False, fmt: str = "jsonl", limit: int | None = None,
              seed: int = 0) -> Stats:
    """Build the `kinds` of examples from `input_path` into `out_dir`. `counterfactual`: also build that many
    counterfactual variants of every document (`data_gen.counterfactual`, paper §4.1), each record marked with its
    `"variant"`; `counterfactual_kinds`: the kinds built from the variants (None: every kind of `kinds`), e.g.
    {"write"} to add renamed documents to the memory-write examples only. After a successful build, the example
    files of an earlier build in `out_dir` that this one did not write are removed (see KINDS)."""
    out = pathlib.Path(out_dir)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    variant_kinds = kinds if counterfactual_kinds is None else set(counterfactual_kinds) & kinds
    try:
        return _build_all(input_path, out, labels, kinds=kinds, query_fn_factory=query_fn_factory,
                          pretext_sentences=pretext_sentences, q_thr=q_thr, max_queries=max_queries,
                          filter_ambiguous=filter_ambiguous, counterfactual=counterfactual,
                          counterfactual_kinds=variant_kinds,
                          context_free=context_free, read_context_free=read_context_free, question_form=question_form,
                          read_question_form=read_question_form, misread_rate=misread_rate,
                          write_evidence=write_evidence, fmt=fmt, limit=limit, seed=seed)
    except BaseException:
        if created:  # the writers removed their temp files; leave no empty output directory either
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _build_all(input_path: str, out: pathlib.Path, labels: Mapping[str, str], *, kinds: set[str], query_fn_factory,
               pretext_sentences: int | None, q_thr: int, max_queries: int, filter_ambiguous: bool, counterfactual: int,
               counterfactual_kinds: set[str], context_free: int, read_context_free: int, question_form: int,
               read_question_form: int, misread_rate: float, write_evidence: bool, fmt: str, limit: int | None,
               seed: int) -> Stats:
    t0 = time.perf_counter()
    streams: list[tuple[int | None, Callable[[], Iterator[Document]]]] = [
        (None, lambda: iter_documents(input_path, labels, limit))]
    if counterfactual:
        from data_gen.counterfactual import name_pools, permutation, replace_entities  # noqa: PLC0415

        raw = [d for i, d in zip(range(limit if limit is not None else 1 << 62), iter_json_array(input_path))]
        list(documents_from_raw(raw, labels, input_path))  # validate before building variants
        pools = name_pools(raw)
        for v in range(counterfactual):
            mapping = permutation(pools, seed, v)
            streams.append((v, lambda m=mapping: documents_from_raw((replace_entities(d, m) for d in raw), labels,
                                                                   f"{input_path} (counterfactual)")))
    names = sorted(kinds) + (["coverage"] if "write" in kinds else [])
    suffix = ".array_record" if fmt == "arrayrecord" else ".jsonl"
    stats = Stats()
    with contextlib.ExitStack() as stack:
        writers = {k: stack.enter_context(ArrayRecordOut(out / f"{k}{suffix}") if fmt == "arrayrecord" and k != "coverage"
                                          else JsonlWriter(out / f"{k}.jsonl")) for k in names}
        for variant, factory in streams:
            doc_kinds = kinds if variant is None else counterfactual_kinds
            query_fn = None
            if "read" in doc_kinds:
                query_fn = query_fn_factory(factory) if query_fn_factory is not None else _gold(factory)
            for doc in factory():
                for kind, rec in build_document(doc, doc_kinds, query_fn, stats, pretext_sentences=pretext_sentences,
                                                q_thr=q_thr, max_queries=max_queries, filter_ambiguous=filter_ambiguous,
                                                context_free=context_free, read_context_free=read_context_free,
                                                question_form=question_form, read_question_form=read_question_form,
                                                misread_rate=misread_rate, write_evidence=write_evidence, seed=seed):
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
