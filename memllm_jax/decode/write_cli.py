"""`memllm memory write`: extract triples from a corpus with the memory-write model, resumably.

    memllm memory write --model DIR --corpus FILE --memory MEMDIR [--batch-size 16] [--encoder minilm]

Corpus formats (by content, one document per record):
  * DocRED: a JSON array or JSONL of records with `sents` (lists of tokens) and `title`;
  * JSONL records with `sentences` (list of strings) or `text` (split into sentences at . ! ?), and an
    optional `id` / `title`;
  * plain text (.txt): one document per line.
Progress (finished document ids) is kept in MEMDIR/write_progress.json, written atomically after the
memory is saved, so an interrupted run continues where it stopped.

Bulk writes in several processes (hosts): process I of N writes only the corpus's documents k with
k % N == I (k = the record's index in the corpus) into its own shard directory, and `memllm memory merge OUT
SHARD...` (memllm_jax/decode/merge_cli.py) joins the shards into the memory one process would have written:

    memllm memory write --model M --corpus C --memory mem.shard$I --process-index $I --process-count $N
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
from typing import Iterator

from memllm_jax import options
from memllm_jax.decode.corpus_writer import WriteDocument
from memllm_jax.docred import detokenize, load_relation_labels
from memllm_jax.errors import InputError, read_text
from memllm_jax.files import atomic_write_json

PROGRESS = "write_progress.json"
_SENT_END = re.compile(r"(?<=[.!?])\s+")


class CorpusError(InputError):
    """A corpus record or progress file the writer cannot use."""


def _doc_from_record(rec, path: pathlib.Path, k: int) -> WriteDocument:
    where = f"{path}: record {k}"
    if not isinstance(rec, dict):
        raise CorpusError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    name = rec.get("id", rec.get("title", k))
    doc_id = f"{k}:{name}"
    if "sents" in rec:
        sents = rec["sents"]
        if not isinstance(sents, list) or not all(isinstance(s, list) and all(isinstance(t, str) for t in s) for s in sents):
            raise CorpusError(f"{where}: field sents: expected a list of token lists")
        text, spans, _ = detokenize(sents)
        return WriteDocument(doc_id, text, tuple(spans))
    if "sentences" in rec:
        sents = rec["sentences"]
        if not isinstance(sents, list) or not all(isinstance(s, str) for s in sents):
            raise CorpusError(f"{where}: field sentences: expected a list of strings")
        return WriteDocument.from_sentences(doc_id, sents)
    if "text" in rec:
        if not isinstance(rec["text"], str):
            raise CorpusError(f"{where}: field text: expected a string")
        return WriteDocument.from_sentences(doc_id, [s for s in _SENT_END.split(rec["text"].strip()) if s])
    raise CorpusError(f"{where}: needs a field sents, sentences or text")


def read_corpus(path: pathlib.Path) -> Iterator[WriteDocument]:
    try:
        raw = read_text(path)
    except OSError as exc:
        raise CorpusError(f"{path}: {exc.strerror}") from exc
    if path.suffix == ".txt":
        for k, line in enumerate(l for l in raw.splitlines() if l.strip()):
            yield WriteDocument.from_sentences(f"{k}:line", [s for s in _SENT_END.split(line.strip()) if s])
        return
    if raw.lstrip().startswith("["):
        try:
            records = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise CorpusError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    else:
        records = []
        for n, line in enumerate(raw.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise CorpusError(f"{path}: line {n}: invalid JSON: {exc.msg}") from exc
    for k, rec in enumerate(records):
        yield _doc_from_record(rec, path, k)


def source_order(source: str) -> tuple[int, int] | None:
    """`(document index k, sentence index i)` of a provenance `k:name/i` this writer gives (the order one process
    writes in), or None for any other source (imported, added by hand)."""
    head, _, sentence = source.rpartition("/")
    k, colon, _ = head.partition(":")
    if colon and k.isdigit() and sentence.isdigit():
        return int(k), int(sentence)
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, type=pathlib.Path, help="memory-write model: model checkpoint, training workdir, HF directory or FILE.gguf")
    parser.add_argument("--tokenizer", type=pathlib.Path, help="tokenizer (default: the one stored with the model)")
    parser.add_argument("--corpus", required=True, type=pathlib.Path)
    parser.add_argument("--memory", required=True, type=pathlib.Path, help="memory directory (created if absent)")
    parser.add_argument("--encoder", default="minilm", help="encoder of a new memory")
    parser.add_argument("--batch-size", type=options.positive_int, default=16, help="sentences decoded together")
    parser.add_argument("--max-new-tokens", type=options.positive_int, default=128, help="tokens per API call")
    parser.add_argument("--pretext-sentences", type=options.nonnegative_int, default=10,
                        help="sentences of the text before the focus sentence given as context")
    parser.add_argument("--no-late-stopping", action="store_true", help="greedy decoding ending at the first })")
    parser.add_argument("--ban-repeats", type=options.nonnegative_int, default=0, metavar="N",
                        help="never write an item twice in a call: take the next choice instead, at most N times")
    parser.add_argument("--save-every", type=options.positive_int, default=20, help="save memory and progress every N batches")
    parser.add_argument("--restart", action="store_true", help="ignore earlier progress")
    parser.add_argument("--process-index", type=options.nonnegative_int, default=0, metavar="I",
                        help="write only the documents k with k %% N == I (a shard; see `memllm memory merge`)")
    parser.add_argument("--process-count", type=options.positive_int, default=1, metavar="N", help="the number of shards")
    parser.add_argument("--grounded", action="store_true",
                        help="write only grounded triples: both names copied from the document, one from the focus "
                             "sentence (and a known relation with --labels)")
    parser.add_argument("--min-confidence", type=options.finite_float, default=None, metavar="LOGP",
                        help="write only the triples the model wrote with at least this confidence: the "
                             "log-probability of the item's least likely token (e.g. -0.6)")
    parser.add_argument("--labels", default=None, metavar="FILE",
                        help="with --grounded: relation labels (JSON object of id -> label, e.g. DocRED's rel_info.json)")


def check_shard(index: int, count: int) -> None:
    if count < 1:
        raise CorpusError(f"--process-count {count}: must be at least 1")
    if not 0 <= index < count:
        raise CorpusError(f"--process-index {index}: must be in 0..{count - 1} (--process-count {count})")


def read_progress(progress_path: pathlib.Path) -> dict:
    """A `write_progress.json`: `corpus` (absolute path), `done` (document ids), `shard` ([I, N]; [0, 1] for
    files written before shards existed) and `total` (documents in the shard; absent in older files)."""
    try:
        state = json.loads(progress_path.read_text(encoding="utf-8"))
        state["done"] = list(state["done"])
        state["shard"] = [int(x) for x in state.get("shard", (0, 1))]
        str(state["corpus"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CorpusError(f"{progress_path}: damaged progress file ({exc})") from exc
    return state


def run_write(model, tok, memory, memory_dir: pathlib.Path, corpus: pathlib.Path, decoding=None, *, batch_size=16,
              pretext_sentences=10, save_every=20, restart=False, progress_bar=True, shard: tuple[int, int] = (0, 1),
              grounded=False, relations=None, min_confidence=None):
    """Write `corpus` into `memory` (saved to `memory_dir`), skipping documents finished earlier; each call decoded
    as `decoding` says (`writer.WriteDecoding`; None: its defaults).

    `shard=(I, N)`: only the documents k with k % N == I (k = the record's index in the corpus)."""
    from tqdm import tqdm

    from memllm_jax.decode.corpus_writer import write_corpus
    from memllm_jax.decode.writer import WriteDecoding

    check_shard(*shard)
    progress_path = memory_dir / PROGRESS
    done: set[str] = set()
    if progress_path.exists() and not restart:
        state = read_progress(progress_path)
        done = set(state["done"])
        if state["corpus"] != str(corpus.resolve()):
            raise CorpusError(f"{progress_path}: field corpus: progress belongs to {state['corpus']}, "
                              f"not {corpus.resolve()} (use --restart)")
        if tuple(state["shard"]) != tuple(shard):
            raise CorpusError(f"{progress_path}: field shard: progress belongs to shard {state['shard'][0]} of "
                              f"{state['shard'][1]}, not {shard[0]} of {shard[1]} (use --restart)")
    index, count = shard
    mine = [d for k, d in enumerate(read_corpus(corpus)) if k % count == index]
    docs = [d for d in mine if d.doc_id not in done]
    bar = tqdm(total=len(docs) + len(done), initial=len(done), unit="doc", disable=not progress_bar)
    batches = [0]

    def checkpoint():
        memory_dir.mkdir(parents=True, exist_ok=True)
        memory.save(memory_dir)
        atomic_write_json(progress_path, {"corpus": str(corpus.resolve()), "shard": list(shard), "total": len(mine),
                                     "done": sorted(done)})

    def on_batch(stats, finished):
        done.update(finished)
        bar.update(len(finished))
        bar.set_postfix(sentences=stats.sentences, triples=stats.triples)
        batches[0] += 1
        if batches[0] % save_every == 0:
            checkpoint()

    stats = write_corpus(model, tok, memory, docs, WriteDecoding() if decoding is None else decoding,
                         batch_size=batch_size, pretext_sentences=pretext_sentences, on_batch=on_batch,
                         grounded=grounded, relations=relations, min_confidence=min_confidence)
    checkpoint()
    bar.close()
    return stats


def main(args: argparse.Namespace) -> int:
    from memllm_jax.decode.io import check_memory, open_memory
    from memllm_jax.decode.writer import write_decoding
    from memllm_jax.model.load import load

    shard = (args.process_index, args.process_count)
    check_shard(*shard)
    if not args.corpus.is_file():  # inputs and the memory first: the model takes a while to load
        raise CorpusError(f"{args.corpus}: {'is a directory, not a corpus file' if args.corpus.is_dir() else 'no such file'}")
    check_memory(args.memory, args.encoder)
    relations = None
    if args.labels:
        relations = set(load_relation_labels(args.labels).values())
    model, tok = load(args.model, tokenizer=args.tokenizer, need_tokenizer=True)
    try:  # before the memory directory is opened: a refused option leaves nothing behind
        decoding = write_decoding(tok, ban_repeats=args.ban_repeats, max_new_tokens=args.max_new_tokens,
                                  late_stopping=not args.no_late_stopping)
    except ValueError as exc:
        field, _, problem = str(exc).partition(" ")  # the setting's name, then its value and the problem
        raise SystemExit(f"--{field.replace('_', '-')} {problem}") from exc
    memory = open_memory(args.memory, args.encoder)
    try:
        stats = run_write(model, tok, memory, args.memory, args.corpus, decoding, batch_size=args.batch_size,
                          pretext_sentences=args.pretext_sentences, save_every=args.save_every, restart=args.restart,
                          shard=shard, grounded=args.grounded, relations=relations,
                          min_confidence=args.min_confidence)
    except CorpusError as exc:
        raise SystemExit(str(exc)) from exc
    print(json.dumps({**stats.__dict__, "ungrounded": len(stats.ungrounded), "unconfident": len(stats.unconfident),
                      "scored": len(stats.scored), "written": len(stats.written)}))
    return 0
