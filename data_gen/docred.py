"""DocRED-format documents (Re-DocRED, DocRED, the synthetic corpus): validation, detokenization with
character offsets, and P-id -> label mapping.

A DocRED document is `{"title", "sents": [[token, ...], ...], "vertexSet": [[mention, ...], ...],
"labels": [{"h", "t", "r", "evidence"}, ...]}` with mentions `{"name", "sent_id", "pos": [start, end),
"type"}`. Loading turns the tokens into plain text (`text`) and gives every token, sentence and mention
its character span in that text, so example builders slice text instead of re-joining tokens.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterable, Iterator, Mapping

from data_gen.io import iter_json_array
from memllm_jax.docred import detokenize
from memllm_jax.errors import InputError

PRONOUNS: frozenset[str] = frozenset(
    "he she it they him her his hers its their theirs them we us our ours i me my mine you your yours "
    "himself herself itself themselves this that these those who whom whose which".split()
)
"""Mentions whose text is one of these are pronoun mentions, not full mentions (paper §3.3)."""

class DocumentError(InputError):
    """A malformed document; the message names the file, the document index and the field."""


@dataclasses.dataclass(frozen=True)
class Mention:
    entity: int
    text: str
    """The mention's surface text, sliced from the detokenized document."""
    sent_id: int
    pos: tuple[int, int]
    """Token span [start, end) within the sentence."""
    span: tuple[int, int]
    """Character span [start, end) within `Document.text`."""
    type: str
    is_pronoun: bool


@dataclasses.dataclass(frozen=True)
class Entity:
    index: int
    mentions: tuple[Mention, ...]
    """Sorted by character position."""
    type: str

    @property
    def full_mentions(self) -> tuple[Mention, ...]:
        return tuple(m for m in self.mentions if not m.is_pronoun)

    @property
    def name(self) -> str:
        """The entity's canonical name: its first full mention (or first mention if all are pronouns)."""
        full = self.full_mentions
        return (full or self.mentions)[0].text


@dataclasses.dataclass(frozen=True)
class Relation:
    head: int
    tail: int
    pid: str
    label: str
    evidence: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Document:
    title: str
    index: int
    text: str
    sentences: tuple[tuple[int, int], ...]
    """Character span of each sentence."""
    tokens: tuple[tuple[tuple[int, int], ...], ...]
    """Character span of each token, per sentence."""
    entities: tuple[Entity, ...]
    relations: tuple[Relation, ...]
    source: str = ""

    @property
    def doc_id(self) -> str:
        return f"{self.index}:{self.title}"

    def mentions_in_order(self) -> list[Mention]:
        return sorted((m for e in self.entities for m in e.mentions), key=lambda m: (m.span, m.entity))


def sentence_document(doc: Document, sent_id: int) -> Document:
    """Sentence `sent_id` of `doc` as a document of its own, without the text before it: its text, tokens and
    mentions shifted to start at 0. Every entity is kept, by index (so `relations` stay valid), with only its
    mentions in the sentence."""
    s0, s1 = doc.sentences[sent_id]

    def shift(span: tuple[int, int]) -> tuple[int, int]:
        return span[0] - s0, span[1] - s0

    entities = tuple(dataclasses.replace(e, mentions=tuple(dataclasses.replace(m, sent_id=0, span=shift(m.span))
                                                           for m in e.mentions if m.sent_id == sent_id))
                     for e in doc.entities)
    return dataclasses.replace(doc, text=doc.text[s0:s1], sentences=((0, s1 - s0),),
                               tokens=(tuple(shift(t) for t in doc.tokens[sent_id]),), entities=entities)


def _err(source: str, index: int, title: object, field: str, msg: str) -> DocumentError:
    return DocumentError(f"{source or '<memory>'}: document {index} (title {title!r}): field {field}: {msg}")


def parse_document(raw: Mapping, index: int, labels: Mapping[str, str], source: str = "") -> Document:
    """Validate one DocRED-format document and build its text with offsets."""
    if not isinstance(raw, Mapping):
        raise _err(source, index, None, "<document>", f"expected a JSON object, got {type(raw).__name__}")
    title = raw.get("title", "")
    for key in ("sents", "vertexSet"):
        if key not in raw:
            raise _err(source, index, title, key, "missing")
    sents = raw["sents"]
    if not isinstance(sents, list) or not sents:
        raise _err(source, index, title, "sents", "expected a non-empty list of sentences")
    for i, s in enumerate(sents):
        if not isinstance(s, list) or not s or not all(isinstance(t, str) for t in s):
            raise _err(source, index, title, f"sents[{i}]", "expected a non-empty list of token strings")
    text, sent_spans, tok_spans = detokenize(sents)

    vertex_set = raw["vertexSet"]
    if not isinstance(vertex_set, list):
        raise _err(source, index, title, "vertexSet", "expected a list of entities")
    entities = []
    for e_idx, ment_list in enumerate(vertex_set):
        where = f"vertexSet[{e_idx}]"
        if not isinstance(ment_list, list) or not ment_list:
            raise _err(source, index, title, where, "expected a non-empty list of mentions")
        mentions = []
        for m_idx, m in enumerate(ment_list):
            mw = f"{where}[{m_idx}]"
            if not isinstance(m, Mapping):
                raise _err(source, index, title, mw, "expected a mention object")
            for key in ("sent_id", "pos"):
                if key not in m:
                    raise _err(source, index, title, f"{mw}.{key}", "missing")
            sid, pos = m["sent_id"], m["pos"]
            if not isinstance(sid, int) or not 0 <= sid < len(sents):
                raise _err(source, index, title, f"{mw}.sent_id", f"{sid!r} is not a sentence index (0..{len(sents) - 1})")
            if (not isinstance(pos, list) or len(pos) != 2 or not all(isinstance(p, int) for p in pos)
                    or not 0 <= pos[0] < pos[1] <= len(sents[sid])):
                raise _err(source, index, title, f"{mw}.pos",
                           f"{pos!r} is not a token span inside sentence {sid} ({len(sents[sid])} tokens)")
            span = (tok_spans[sid][pos[0]][0], tok_spans[sid][pos[1] - 1][1])
            surface = text[span[0]:span[1]]
            mentions.append(Mention(e_idx, surface, sid, (pos[0], pos[1]), span, str(m.get("type", "")),
                                    surface.lower() in PRONOUNS))
        mentions.sort(key=lambda m: m.span)
        entities.append(Entity(e_idx, tuple(mentions), mentions[0].type))

    raw_labels = raw.get("labels", [])
    if not isinstance(raw_labels, list):
        raise _err(source, index, title, "labels", "expected a list")
    relations = []
    for l_idx, lab in enumerate(raw_labels):
        lw = f"labels[{l_idx}]"
        if not isinstance(lab, Mapping):
            raise _err(source, index, title, lw, "expected a relation object")
        for key in ("h", "t", "r"):
            if key not in lab:
                raise _err(source, index, title, f"{lw}.{key}", "missing")
        for key in ("h", "t"):
            if not isinstance(lab[key], int) or not 0 <= lab[key] < len(entities):
                raise _err(source, index, title, f"{lw}.{key}", f"{lab[key]!r} is not an entity index (0..{len(entities) - 1})")
        if lab["r"] not in labels:
            raise _err(source, index, title, f"{lw}.r", f"unknown relation id {lab['r']!r}")
        evidence = lab.get("evidence", [])
        if not isinstance(evidence, list) or not all(isinstance(x, int) and 0 <= x < len(sents) for x in evidence):
            raise _err(source, index, title, f"{lw}.evidence", f"{evidence!r} is not a list of sentence indices")
        relations.append(Relation(lab["h"], lab["t"], lab["r"], labels[lab["r"]], tuple(evidence)))
    return Document(str(title), index, text, tuple(sent_spans), tuple(tuple(s) for s in tok_spans),
                    tuple(entities), tuple(relations), source)


def iter_documents(path: str | os.PathLike, labels: Mapping[str, str], limit: int | None = None) -> Iterator[Document]:
    """Stream the validated documents of a DocRED-format JSON array (or a .jsonl file); a file without
    documents is an error (an empty build is never what was meant)."""
    n = 0
    for n, raw in enumerate(iter_json_array(path), 1):
        if limit is not None and n > limit:
            return
        yield parse_document(raw, n - 1, labels, str(path))
    if n == 0:
        raise DocumentError(f"{path}: no documents (an empty corpus)")


def load_documents(path: str | os.PathLike, labels: Mapping[str, str], limit: int | None = None) -> list[Document]:
    return list(iter_documents(path, labels, limit))


def documents_from_raw(raws: Iterable[Mapping], labels: Mapping[str, str], source: str = "") -> Iterator[Document]:
    for i, raw in enumerate(raws):
        yield parse_document(raw, i, labels, source)
