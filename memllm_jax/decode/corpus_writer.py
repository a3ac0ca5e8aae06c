"""Documents written into a memory (paper §3.2): each sentence of a document becomes the focus sentence of a write
prompt with a bounded pretext (`iter_write_prompts`), the calls are decoded by `writer` (in consecutive batches)
or `refill` (a pool refilled as its rows stop), checked (`check_written`: grounded names, known relations, a
confidence threshold) and added to the memory with provenance `doc_id/sentence_index` (`write_corpus`).
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from typing import Any, Collection, Iterable, Iterator, Sequence

from memllm_jax import protocol
from memllm_jax.decode.graph import split_model
from memllm_jax.decode.refill import iter_refill_writes
from memllm_jax.decode.writer import WriteDecoding, decode_writes, item_confidences


@dataclasses.dataclass(frozen=True)
class WriteDocument:
    """A document as text plus sentence character spans (pretext = text before the focus sentence)."""

    doc_id: str
    text: str
    sentences: tuple[tuple[int, int], ...]
    first_focus: int = 0
    """Sentences before this index are pretext only (e.g. earlier chat statements)."""

    @classmethod
    def from_sentences(cls, doc_id: str, sentences: Sequence[str], first_focus: int = 0) -> "WriteDocument":
        spans, pos = [], 0
        for s in sentences:
            spans.append((pos, pos + len(s)))
            pos += len(s) + 1
        return cls(str(doc_id), " ".join(sentences), tuple(spans), first_focus)


def as_write_document(doc: Any, index: int = 0) -> WriteDocument:
    """Accept a WriteDocument, an object with `doc_id`/`text`/`sentences` spans (data_gen's Document), a
    `(doc_id, [sentences])` pair, or a list of sentence strings."""
    if isinstance(doc, WriteDocument):
        return doc
    if hasattr(doc, "text") and hasattr(doc, "sentences"):
        return WriteDocument(str(getattr(doc, "doc_id", index)), doc.text, tuple(tuple(s) for s in doc.sentences))
    if isinstance(doc, tuple) and len(doc) == 2 and isinstance(doc[0], str) and not isinstance(doc[1], str):
        return WriteDocument.from_sentences(doc[0], list(doc[1]))
    if isinstance(doc, (list, tuple)) and all(isinstance(s, str) for s in doc):
        return WriteDocument.from_sentences(str(index), list(doc))
    raise TypeError(f"document {index}: expected sentences, (doc_id, sentences) or a Document, got {type(doc).__name__}")


def iter_write_prompts(doc: WriteDocument, tokenizer, pretext_sentences: int = 10,
                       max_prompt_tokens: int = 384) -> Iterator[tuple[str, list[int]]]:
    """(provenance, prompt ids ending with `({MEM_WRITE-->`) per sentence; the pretext is the up-to-
    `pretext_sentences` preceding sentences, dropped from the front until the prompt fits."""
    mem_write = tokenizer.marker_id[protocol.MEM_WRITE]
    for i, (start, end) in enumerate(doc.sentences):
        if i < doc.first_focus:
            continue
        first = max(0, i - pretext_sentences)
        while True:
            pre = doc.text[doc.sentences[first][0] : start] if first < i else ""
            ids = [tokenizer.bos_id] + tokenizer.encode(protocol.format_write_prompt(pre, doc.text[start:end]))
            if len(ids) + 1 <= max_prompt_tokens or first >= i:
                break
            first += 1
        yield f"{doc.doc_id}/{i}", (ids + [mem_write])[-max_prompt_tokens:]


@dataclasses.dataclass
class WriteStats:
    documents: int = 0
    sentences: int = 0
    triples: int = 0
    """Triples parsed from the cut calls and added (before the memory's de-duplication)."""
    malformed: int = 0
    """Items of the calls that did not parse."""
    no_cut: int = 0
    """Sentences whose call never reached a closing token within the token budget (only the call's items closed
    by `;` are written)."""
    tokens: int = 0
    """Tokens generated, including those after the chosen cut."""
    repeats: int = 0
    """Sentences whose call would have written an item again after its item bans ran out (`decoding.bans`)."""
    ungrounded: list[protocol.Triple] = dataclasses.field(default_factory=list)
    """Parsed triples dropped by the grounding check (`write_corpus(grounded=True)`), not written."""
    unconfident: list[protocol.Triple] = dataclasses.field(default_factory=list)
    """Grounded (or unchecked) triples dropped because the model wrote them with less than `min_confidence`."""
    scored: list[tuple[str, protocol.Triple, float]] = dataclasses.field(default_factory=list)
    """With `min_confidence`: every triple that reached the confidence check, kept or not, as (source sentence,
    triple, confidence) in writing order; `write_scored` adds them to a memory at another threshold."""
    written: list[tuple[str, protocol.Triple, str]] = dataclasses.field(default_factory=list)
    """Every parsed triple as (source sentence, triple, fate), sentence by sentence, fate one of `FATES`: what
    the model wrote and what the checks made of it (the pipeline's memory stage saves it beside the memory)."""


FATES = ("kept", "ungrounded", "unconfident")


def _normalized(text: str) -> str:
    return " ".join(text.lower().split())


def _occurs(name: str, text: str) -> bool:
    """`name` occurs in `text` as whole words (both normalised): "Ann" is not in "Anna"."""
    return bool(name) and re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text) is not None


def is_grounded(triple: protocol.Triple, context: str, sentence: str, relations: Collection[str] | None,
                relation_phrases: bool = False) -> bool:
    """A model-written triple is grounded when both its names occur (as whole words) in the text it was written
    from (`context`: the document up to and including the focus sentence), at least one of them in the focus
    `sentence`, its two names differ, and its relation is a known relation type (when `relations` is given,
    normalised; with `relation_phrases` also a relation named by words of the focus sentence, "X's mentor was Y"
    written `X>>mentor>>Y`). Case and whitespace are ignored. A name related to itself (`Openfire>>developer>>Openfire`, as an
    undertrained writer emits for a sentence it cannot parse) almost never states a fact: 12 of Re-DocRED's 17,361
    test triples have one name on both sides, two entities named alike (`Swedish>>official language>>Swedish`)."""
    context, sentence = _normalized(context), _normalized(sentence)
    subject, obj = _normalized(triple.subject), _normalized(triple.object)
    if subject == obj:
        return False
    if not (_occurs(subject, context) and _occurs(obj, context) and (_occurs(subject, sentence) or _occurs(obj, sentence))):
        return False
    relation = _normalized(triple.relation)
    return relations is None or relation in relations or (relation_phrases and _occurs(relation, sentence))


@dataclasses.dataclass
class CheckedWrite:
    """The triples of one memory-write call after the checks of `check_written`."""

    kept: list[protocol.Triple]
    ungrounded: list[protocol.Triple]
    unconfident: list[protocol.Triple]
    confidences: list[tuple[protocol.Triple, float]]
    """With `min_confidence`: each triple that reached the confidence check, in writing order, with its confidence."""


def check_written(items: list[protocol.Triple], out: dict, tokenizer, text: tuple[str, str] | None,
                  relations: Collection[str] | None, min_confidence: float | None,
                  relation_phrases: bool = False) -> CheckedWrite:
    """The triples parsed from one `decode_writes` result `out`, checked: with `text` (context, focus sentence)
    only grounded triples are kept (`is_grounded`, against the relation names `relations` if given and, with
    `relation_phrases`, the focus sentence's words), with
    `min_confidence` only those the model wrote with at least that confidence (`item_confidences`)."""
    ungrounded: list[protocol.Triple] = []
    unconfident: list[protocol.Triple] = []
    confidences: list[tuple[protocol.Triple, float]] = []
    if text is not None:
        known = None if relations is None else {_normalized(r) for r in relations}
        kept = [t for t in items if is_grounded(t, *text, known, relation_phrases)]
        ungrounded, items = [t for t in items if t not in kept], kept
    if min_confidence is not None and items:
        conf = item_confidences(tokenizer, out["ids"], out["logps"])
        confidences = [(t, conf.get(t, -float("inf"))) for t in items]
        kept = [t for t, c in confidences if c >= min_confidence]
        unconfident, items = [t for t in items if t not in kept], kept
    return CheckedWrite(items, ungrounded, unconfident, confidences)


@dataclasses.dataclass(frozen=True)
class _Sentence:
    """One write prompt of a corpus."""
    doc_id: str
    source: str
    """Provenance `doc_id/sentence_index`."""
    ids: list[int]
    text: tuple[str, str]
    """(the document up to the focus sentence, the focus sentence), for the grounding check."""


def _corpus_prompts(documents: Iterable[Any], tokenizer, pretext_sentences: int,
                    max_prompt_tokens: int) -> Iterator[tuple[str, list[_Sentence]]]:
    for k, raw in enumerate(documents):
        doc = as_write_document(raw, k)
        yield doc.doc_id, [_Sentence(doc.doc_id, src, ids, _focus_text(doc, src))
                           for src, ids in iter_write_prompts(doc, tokenizer, pretext_sentences, max_prompt_tokens)]


@dataclasses.dataclass
class _Book:
    """Adds decoded calls to the memory and the statistics, sentence by sentence, and tells when a document is
    done."""
    memory: Any
    tokenizer: Any
    grounded: bool
    relations: Collection[str] | None
    min_confidence: float | None
    on_batch: Any
    relation_phrases: bool = False
    stats: WriteStats = dataclasses.field(default_factory=WriteStats)
    remaining: dict[str, int] = dataclasses.field(default_factory=dict)

    def begin(self, doc_id: str, n_sentences: int) -> None:
        """A document with `n_sentences` prompts to come (none: it is done now)."""
        if n_sentences:
            self.remaining[doc_id] = self.remaining.get(doc_id, 0) + n_sentences
            return
        self.stats.documents += 1
        self.report([doc_id])

    def report(self, finished: list[str]) -> None:
        if self.on_batch is not None:
            self.on_batch(self.stats, finished)

    def record(self, sentence: _Sentence, out: dict) -> str | None:
        """Add one sentence's call; returns its document's id if that was the document's last sentence."""
        stats = self.stats
        stats.sentences += 1
        stats.tokens += out["n_generated"]
        parsed = protocol.parse_write_call(out["text"])  # an unclosed call keeps its items closed by `;`
        stats.no_cut += out["cut"] < 0
        stats.repeats += out["stop"] == "repeat"
        stats.malformed += sum(not e.startswith(protocol.TRUNCATION_NOTES) for e in parsed.errors)
        checked = check_written(list(parsed.items), out, self.tokenizer, sentence.text if self.grounded else None,
                                self.relations, self.min_confidence, self.relation_phrases)
        stats.ungrounded += checked.ungrounded
        stats.unconfident += checked.unconfident
        stats.scored += [(sentence.source, t, c) for t, c in checked.confidences]
        stats.written += [(sentence.source, t, fate) for fate, triples in zip(FATES, (
            checked.kept, checked.ungrounded, checked.unconfident)) for t in triples]
        if checked.kept:
            stats.triples += _add_untrusted(self.memory, checked.kept, sentence.source)
        self.remaining[sentence.doc_id] -= 1
        if self.remaining[sentence.doc_id]:
            return None
        del self.remaining[sentence.doc_id]
        stats.documents += 1
        return sentence.doc_id


def write_corpus(model, tokenizer, memory, documents: Iterable[Any], decoding: WriteDecoding = WriteDecoding(), *,
                 batch_size: int = 16, pretext_sentences: int = 10, max_prompt_tokens: int = 384, make_cache=None,
                 on_batch=None, share_prefixes: bool = True, grounded: bool = False,
                 relations: Collection[str] | None = None, min_confidence: float | None = None,
                 refill: bool = False, relation_phrases: bool = False) -> WriteStats:
    """Extract triples from every sentence of `documents` and add them to `memory`, sentence by sentence in
    corpus order, each call decoded as `decoding` says (`writer.WriteDecoding`, built from a user's settings by
    `writer.write_decoding`).

    `refill=False`: consecutive batches of `batch_size` sentences, mixing consecutive documents; the prompts of
    one document share their pretext, which is prefilled once per batch (`share_prefixes`). `on_batch(stats,
    finished_doc_ids)` runs after every batch (progress bars, checkpoints for resuming): `finished_doc_ids` are
    the documents all of whose sentences are now in the memory. `refill=True`: a pool of `batch_size` rows that
    takes the next sentences as its rows finish (`refill.iter_refill_writes`; the same calls up to the rounding
    of a prompt's prefill in a batch of another shape, which can flip a greedy near-tie), and `on_batch`
    runs after every exit of its loop. A document with no sentence is reported as soon as it is read.

    `grounded`: keep only the triples that pass `is_grounded` (names copied from the text, a known relation
    among `relations` if given, or with `relation_phrases` a phrase of the focus sentence); the others are counted
    in `WriteStats.ungrounded`, not written.
    `min_confidence`: keep only the triples whose weakest token the model chose with at least this
    log-probability (`item_confidences`); the others are counted in `WriteStats.unconfident`.
    Calls stopped out of item bans (`decoding.bans`) are counted in `WriteStats.repeats`.
    """
    book = _Book(memory, tokenizer, grounded, relations, min_confidence, on_batch, relation_phrases)
    decode = dict(make_cache=make_cache, share_prefixes=share_prefixes, split=split_model(model))
    documents = _corpus_prompts(documents, tokenizer, pretext_sentences, max_prompt_tokens)
    (_write_refilled if refill else _write_batched)(model, tokenizer, book, documents, batch_size, decoding, decode)
    return book.stats


def _write_batched(model, tokenizer, book: _Book, documents, batch_size: int, decoding: WriteDecoding,
                   decode: dict) -> None:
    pending: list[_Sentence] = []

    def flush(final: bool) -> None:
        while pending and (final or len(pending) >= batch_size):
            batch, pending[:] = pending[:batch_size], pending[batch_size:]
            outs = decode_writes(model, tokenizer, [p.ids for p in batch], decoding, pad_to=batch_size, **decode)
            book.report([d for d in (book.record(p, out) for p, out in zip(batch, outs)) if d is not None])

    for doc_id, sentences in documents:
        book.begin(doc_id, len(sentences))
        pending += sentences
        flush(False)
    flush(True)


def _write_refilled(model, tokenizer, book: _Book, documents, batch_size: int, decoding: WriteDecoding,
                    decode: dict) -> None:
    """The whole corpus's prompts are read first (the pool's cache fits the longest); calls finish out of order
    and are recorded in corpus order, so the memory is the one `_write_batched` gives (up to prefill rounding)."""
    sentences: list[_Sentence] = []
    for doc_id, doc_sentences in documents:
        book.begin(doc_id, len(doc_sentences))
        sentences += doc_sentences
    outs: dict[int, dict] = {}
    recorded = 0
    for finished in iter_refill_writes(model, tokenizer, [p.ids for p in sentences], decoding, pool=batch_size,
                                       **decode):
        outs.update(finished)
        done = []
        while recorded in outs:
            done.append(book.record(sentences[recorded], outs.pop(recorded)))
            recorded += 1
        book.report([d for d in done if d is not None])


def write_scored(memory, scored: Sequence[tuple[str, protocol.Triple, float]], min_confidence: float | None) -> int:
    """Add the triples of `WriteStats.scored` written with at least `min_confidence` (None: all) to `memory`, one
    sentence at a time as `write_corpus` does: the memory a write at that threshold would have given, without
    decoding again. Returns the triples added."""
    added = 0
    for source, group in itertools.groupby(scored, key=lambda item: item[0]):
        kept = [t for _, t, c in group if min_confidence is None or c >= min_confidence]
        if kept:
            added += _add_untrusted(memory, kept, source)
    return added


def _focus_text(doc: WriteDocument, source: str) -> tuple[str, str]:
    """(the document up to and including the focus sentence, the focus sentence) of the prompt `source`."""
    start, end = doc.sentences[int(source.rsplit("/", 1)[1])]
    return doc.text[:end], doc.text[start:end]


def _add_untrusted(memory, triples: list[protocol.Triple], source: str) -> int:
    """Add model-written triples; a triple whose names the memory refuses (ValueError) is skipped alone."""
    try:
        memory.add(triples, source=source)
        return len(triples)
    except ValueError:
        added = 0
        for t in triples:
            try:
                memory.add([t], source=source)
                added += 1
            except ValueError:
                pass
        return added
