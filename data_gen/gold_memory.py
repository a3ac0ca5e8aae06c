"""Memories for the read-example builder: an exact gold lookup, and filling a TripleMemory with gold triples.

`GoldLookup` answers a query by exact (case-insensitive, whitespace-normalised) match of the given entity
against every full-mention surface form of the entities in the gold triples, and returns the other entity's
canonical name (its first full mention). `fill_memory` writes a corpus's gold triples into a
`memllm_jax.memory.TripleMemory` (`unique_gold_triples`: the same triples as a list, in its order);
`memory_query_fn` adapts that memory to the builder's `query_fn`.
`gold_triples` / `entity_gold`: a document's gold facts as triples of canonical names / as relations between
entities with all their names, what written memories are scored against (`memllm_jax.eval.write_quality`).
"""

from __future__ import annotations

from typing import Iterable, Sequence

from data_gen.docred import Document
from memllm_jax import protocol as P
from memllm_jax.eval.write_quality import EntityGold, normalize_name


def entity_names(entity) -> frozenset[str]:
    """Every name an entity goes by, `normalize_name`d: its full mentions and its canonical name."""
    return frozenset({normalize_name(m.text) for m in entity.full_mentions} | {normalize_name(entity.name)})


def entity_gold(doc: Document) -> EntityGold:
    """The document's relations by entity index, with every name (full mention, canonical name) of each entity:
    what `memllm_jax.eval.write_quality.entity_agreement` counts written triples against."""
    names = [entity_names(e) for e in doc.entities]
    return EntityGold(names, frozenset((r.head, normalize_name(r.label), r.tail) for r in doc.relations
                                       if r.head != r.tail))


def gold_triples(doc: Document) -> list[P.Triple]:
    """The document's relations with canonical entity names (duplicates removed, order kept)."""
    out: list[P.Triple] = []
    seen: set[P.Triple] = set()
    for rel in doc.relations:
        if rel.head == rel.tail:
            continue
        t = P.Triple(doc.entities[rel.head].name, rel.label, doc.entities[rel.tail].name)
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


class GoldLookup:
    """Exact-match memory over gold triples, with every surface form of each entity as a key."""

    def __init__(self) -> None:
        self._objects: dict[tuple[str, str], list[str]] = {}
        self._subjects: dict[tuple[str, str], list[str]] = {}
        self.n_triples = 0

    def add_document(self, doc: Document) -> None:
        for rel in doc.relations:
            if rel.head == rel.tail:
                continue
            head, tail = doc.entities[rel.head], doc.entities[rel.tail]
            label = normalize_name(rel.label)
            self.n_triples += 1
            for m_text in entity_names(head):
                lst = self._objects.setdefault((m_text, label), [])
                if tail.name not in lst:
                    lst.append(tail.name)
            for m_text in entity_names(tail):
                lst = self._subjects.setdefault((m_text, label), [])
                if head.name not in lst:
                    lst.append(head.name)

    def add_documents(self, docs: Iterable[Document]) -> "GoldLookup":
        for d in docs:
            self.add_document(d)
        return self

    def __call__(self, queries: Sequence[P.Query]) -> list[list[str]]:
        out = []
        for q in queries:
            table, key = (self._objects, q.subject) if q.is_object_query else (self._subjects, q.object)
            out.append(list(table.get((normalize_name(key or ""), normalize_name(q.relation)), ())))
        return out


def unique_gold_triples(docs: Iterable[Document]) -> list[P.Triple]:
    """The documents' gold triples, each once, in the order `fill_memory` stores them (first occurrence first):
    a memory built from this list answers every query exactly as the filled one, ties included."""
    return list(dict.fromkeys(t for doc in docs for t in gold_triples(doc)))


def fill_memory(memory, docs: Iterable[Document], batch_docs: int = 256) -> int:
    """Add every document's gold triples to a TripleMemory (source = document id); returns triples added."""
    n = 0
    batch: list[P.Triple] = []
    for i, doc in enumerate(docs, 1):
        batch.extend(gold_triples(doc))
        if i % batch_docs == 0 and batch:
            memory.add(batch, source="gold")
            n += len(batch)
            batch = []
    if batch:
        memory.add(batch, source="gold")
        n += len(batch)
    return n


def memory_query_fn(memory, config=None):
    """Adapt a TripleMemory to `query_fn`: one batched query; `too_large` results become None."""

    def query_fn(queries: Sequence[P.Query]) -> list[list[str] | None]:
        results = memory.query(list(queries), config=config)
        return [None if r.too_large else list(r.entities) for r in results]

    return query_fn
