"""Evaluation documents for Table 2 and their tokenization with character offsets.

An `EvalDoc` is one document: its plain text, every entity mention span, the gold memory reads (character
position of the read, gold queries, gold target entity and the target mention's span) and the document's
gold triples. `load_eval_docs` reads the JSONL `kind: "eval"` records described in docs/data.md.

Tokenization: the (escaped) text is tokenized once, as a whole, and every row of Table 2 scores exactly
that token sequence (Baseline #1 sees the document's own tokenization); reads are inserted between its
tokens, before the token that holds the read's character position (the space before the target name for
tokenizers that attach spaces to words). Text is never re-tokenized in pieces split at a name, which with
such tokenizers would leave a lone space token before the name and make it look unlikely. Mention spans are
mapped to tokens through character offsets: a token belongs to a span when their character ranges overlap.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Sequence

import numpy as np

from memllm_jax import protocol
from memllm_jax.eval.mixture import char_spans_to_token_mask
from memllm_jax.errors import InputError
from memllm_jax.train.data import read_jsonl


@dataclasses.dataclass(frozen=True)
class GoldRead:
    char_pos: int
    """Character offset in `text` where the read is placed (immediately before the target mention)."""
    queries: tuple[protocol.Query, ...]
    targets: tuple[str, ...]
    """The target entities' names as mentioned (what ⑧ / ⑨ put into the result)."""
    target_spans: tuple[tuple[int, int], ...]
    """Character spans [start, end) of the target mentions."""


@dataclasses.dataclass(frozen=True)
class EvalDoc:
    doc_id: str
    text: str
    """The document text, already escaped with `protocol.escape_text`; every offset indexes this string."""
    entity_spans: tuple[tuple[int, int], ...]
    """Named entity mentions (pronoun mentions are not entities for ENTITY PPL)."""
    reads: tuple[GoldRead, ...]
    triples: tuple[protocol.Triple, ...]


def _query(obj: Any, where: str) -> protocol.Query:
    if isinstance(obj, str):
        parsed = protocol.parse_queries(obj)
        if not parsed.ok or len(parsed.items) != 1:
            raise InputError(f"{where}: cannot parse query {obj!r}: {parsed.errors}")
        return parsed.items[0]
    if isinstance(obj, dict):
        return protocol.Query(obj.get("subject") or None, obj["relation"], obj.get("object") or None)
    s, r, o = obj
    return protocol.Query(s or None, r, o or None)


def _triple(obj: Any) -> protocol.Triple:
    if isinstance(obj, dict):
        return protocol.Triple(obj["subject"], obj["relation"], obj["object"])
    return protocol.Triple(*obj)


def _span(obj: Any) -> tuple[int, int]:
    if isinstance(obj, dict):
        obj = obj.get("span", obj)
        if isinstance(obj, dict):
            return int(obj["start"]), int(obj["end"])
    return int(obj[0]), int(obj[1])


def doc_from_record(rec: dict, where: str = "record") -> EvalDoc:
    """Build an EvalDoc from one `kind: "eval"` record (docs/data.md); errors name the record and field."""
    field = "text"
    try:
        text = rec["text"]
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        reads = []
        for k, r in enumerate(rec.get("reads", [])):
            field = f"reads[{k}]"
            targets = r["targets"]
            reads.append(GoldRead(int(r["pos"]), tuple(_query(q, f"{where} {field}.queries") for q in r["queries"]),
                                  tuple(t["name"] for t in targets), tuple(_span(t["span"]) for t in targets)))
        field = "entity_mentions"
        mentions = [m for m in rec.get("entity_mentions", []) if not m.get("pronoun", False)]
        field = "triples"
        triples = tuple(_triple(t) for t in rec.get("triples", []))
        return EvalDoc(str(rec.get("doc", where)), text, tuple(_span(m) for m in mentions),
                       tuple(sorted(reads, key=lambda r: r.char_pos)), triples)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise InputError(f"{where}: bad eval record field {field!r}: {exc!r}") from exc


def load_eval_docs(path: str | pathlib.Path, limit: int | None = None) -> list[EvalDoc]:
    docs = []
    for where, rec in read_jsonl(str(path)):
        if rec.get("kind", "eval") != "eval":
            continue
        docs.append(doc_from_record(rec, where))
        if limit is not None and len(docs) >= limit:
            break
    return docs


def encode_with_offsets(tok: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids of (already escaped) `text` and each token's character range [start, end) in it."""
    ids = list(tok.encode(text)) if text else []
    hf = _hf_tokenizer(tok)
    if hf is not None and text:
        enc = hf.encode(text, add_special_tokens=False)
        if list(enc.ids) == ids:
            return ids, [(int(a), int(b)) for a, b in enc.offsets]
    ends, prev = [], 0  # fallback: decoded prefix lengths (pieces may straddle characters: keep monotone)
    for k in range(1, len(ids) + 1):
        n = max(prev, min(len(tok.decode(ids[:k])), len(text)))
        ends.append(n)
        prev = n
    if ids:
        ends[-1] = len(text)
    offsets, start = [], 0
    for e in ends:
        offsets.append((start, e))
        start = e
    return ids, offsets


def _hf_tokenizer(tok: Any) -> Any:
    """The `tokenizers.Tokenizer` inside a tokenizer wrapper, if there is one (it knows exact offsets)."""
    try:
        import tokenizers
    except ImportError:  # pragma: no cover
        return None
    if isinstance(tok, tokenizers.Tokenizer):
        return tok
    for value in vars(tok).values() if hasattr(tok, "__dict__") else ():
        if isinstance(value, tokenizers.Tokenizer):
            return value
        inner = getattr(value, "_tokenizer", None)
        if isinstance(inner, tokenizers.Tokenizer):
            return inner
    return None


@dataclasses.dataclass
class EncodedDoc:
    doc: EvalDoc
    ids: list[int]
    offsets: list[tuple[int, int]]
    read_tokens: list[int]
    """Token index of each gold read (same order as doc.reads)."""
    masks: dict[str, np.ndarray]
    """overall / target / entity boolean masks over the text tokens."""


def token_at(offsets: Sequence[tuple[int, int]], char_pos: int) -> int:
    """Index of the first token that ends after `char_pos` (the token holding it, or the next one); a read
    there is inserted before that token. len(offsets) when the position is past the last token."""
    for i, (_, end) in enumerate(offsets):
        if end > char_pos:
            return i
    return len(offsets)


def encode_document(tok: Any, doc: EvalDoc) -> EncodedDoc:
    ids, offsets = encode_with_offsets(tok, doc.text)
    read_tokens = [token_at(offsets, r.char_pos) for r in doc.reads]
    masks = {
        "overall": np.ones(len(ids), bool),
        "target": char_spans_to_token_mask(offsets, [sp for r in doc.reads for sp in r.target_spans]),
        "entity": char_spans_to_token_mask(offsets, doc.entity_spans),
    }
    return EncodedDoc(doc, ids, offsets, read_tokens, masks)


def encode_documents(tok: Any, docs: Sequence[EvalDoc]) -> list[EncodedDoc]:
    return [encode_document(tok, d) for d in docs]
