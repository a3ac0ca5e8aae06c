"""How well a memory-write model's triples agree with the gold triples of the same documents.

Names are compared case- and whitespace-insensitively. Two ways to count (`write_agreement`,
`entity_agreement`):

- by name: a written triple is correct when the exact (subject, relation, object) is among the gold triples,
  each gold entity named by one canonical name (its first full mention in its document);
- by entity: DocRED's gold relations hold between entities, each of which a document may name several ways
  ("Barack Obama", later "Obama"); a written triple is correct when some gold relation has its label, and its
  subject and object are each one of the names (full mentions) of that relation's head and tail entity. Recall
  is over the documents' gold relations, each found once however many of its names were written. The
  memory-write examples name an entity as the sentence they come from names it, so this count does not fault a
  model for writing what it was taught.

Either way coreference is strict: "She" written instead of the person's name is wrong, as it would be useless
to a later read.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter
from typing import Collection, Iterable, Mapping, Sequence

from memllm_jax import protocol


def normalize_name(text: str) -> str:
    """A name or relation label as triples are compared: lower-cased, whitespace collapsed."""
    return " ".join(text.lower().split())


def _key(subject: str, relation: str, obj: str) -> tuple[str, str, str]:
    return tuple(normalize_name(x) for x in (subject, relation, obj))  # type: ignore[return-value]


def triple_key(t: dict | protocol.Triple) -> tuple[str, str, str]:
    """What a triple (a memory record or a Triple) is compared by: its names, lower-cased, whitespace normalised."""
    return _key(t["subject"], t["relation"], t["object"]) if isinstance(t, dict) else _key(t.subject, t.relation, t.object)


def write_agreement(written: Iterable[dict | protocol.Triple], gold: Iterable[protocol.Triple]) -> dict:
    """Precision / recall / F1 of written triples (memory records or Triples) against gold Triples."""
    return _key_agreement({triple_key(t) for t in written}, {triple_key(t) for t in gold})


def agreement_by_relation_frequency(written: Iterable[dict | protocol.Triple], gold: Iterable[protocol.Triple],
                                    taught: Mapping[str, int], groups: int = 3) -> list[dict]:
    """`write_agreement` within groups of relations ordered by how often the training data teach them (`taught`:
    `normalize_name`d relation label -> its targets in the training memory-write examples). The groups split the
    gold triples into about equal parts, the least taught relations first, one relation never split; a written
    triple counts in the group its relation's count falls in. Shows whether a writer misses the relations it was
    taught least (more training text would help) or misses evenly. Each group: `taught_min` / `taught_max`
    (None for the last: no upper bound), `relations` (gold relation labels in it), then the agreement."""
    written_keys, gold_keys = {triple_key(t) for t in written}, {triple_key(t) for t in gold}
    count = lambda relation: taught.get(relation, 0)  # noqa: E731
    gold_per_relation = Counter(key[1] for key in gold_keys)
    bounds, seen, previous = [0], 0, 0  # each group's lowest count
    for relation in sorted(gold_per_relation, key=lambda r: (count(r), r)):
        if seen >= len(bounds) * len(gold_keys) / groups and count(relation) > previous:
            bounds.append(count(relation))
        seen, previous = seen + gold_per_relation[relation], count(relation)
    group_of = lambda relation: bisect.bisect_right(bounds, count(relation)) - 1  # noqa: E731
    return [{"taught_min": lo, "taught_max": bounds[g + 1] - 1 if g + 1 < len(bounds) else None,
             "relations": sum(1 for r in gold_per_relation if group_of(r) == g),
             **_key_agreement({k for k in written_keys if group_of(k[1]) == g}, {k for k in gold_keys if group_of(k[1]) == g})}
            for g, lo in enumerate(bounds)]


def _key_agreement(written_keys: set, gold_keys: set) -> dict:
    hit = len(written_keys & gold_keys)
    precision = hit / len(written_keys) if written_keys else 0.0
    recall = hit / len(gold_keys) if gold_keys else 0.0
    f1 = _f1(precision, recall)
    return {"written_unique": len(written_keys), "gold_unique": len(gold_keys), "correct": hit,
            "precision": precision, "recall": recall, "f1": f1}


def _f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


@dataclasses.dataclass(frozen=True)
class EntityGold:
    """One document's gold relations over its entities (`data_gen.gold_memory.entity_gold` builds it)."""

    names: Sequence[Collection[str]]
    """Per entity index: every name it goes by (`normalize_name`d full mentions)."""
    relations: Collection[tuple[int, str, int]]
    """(head entity, `normalize_name`d relation label, tail entity)."""


def entity_agreement(written: Iterable[dict | protocol.Triple], gold: Sequence[EntityGold]) -> dict:
    """Precision / recall / F1 counted by entity (module docstring) of written triples (memory records or Triples)
    against the documents' `EntityGold`. As in `write_agreement`, a triple is judged by its names, whichever
    document it was written from (the memory keeps one copy of a triple however many documents state it), and it
    finds every gold relation it names, in every document."""
    relations_by_key: dict[tuple[str, str, str], list[tuple[int, int, str, int]]] = {}
    for d, doc in enumerate(gold):
        for head, label, tail in doc.relations:
            for subject in doc.names[head]:
                for obj in doc.names[tail]:
                    relations_by_key.setdefault((subject, label, obj), []).append((d, head, label, tail))
    written_keys = {triple_key(t) for t in written}
    found = [relations_by_key[k] for k in written_keys if k in relations_by_key]
    n_gold = sum(len(doc.relations) for doc in gold)
    n_found = len({r for rels in found for r in rels})
    precision = len(found) / len(written_keys) if written_keys else 0.0
    recall = n_found / n_gold if n_gold else 0.0
    return {"written_unique": len(written_keys), "gold_relations": n_gold, "correct": len(found),
            "gold_relations_found": n_found, "precision": precision, "recall": recall, "f1": _f1(precision, recall)}


def threshold_label(min_confidence: float | None) -> str:
    """A confidence threshold as printed in reports: "any" for None (every triple kept)."""
    return "any" if min_confidence is None else str(min_confidence)


def choose_min_confidence(scored: Iterable[tuple[protocol.Triple, float]], gold: Iterable[protocol.Triple],
                          candidates: Iterable[float | None]) -> tuple[float | None, list[dict]]:
    """The confidence threshold with the highest F1 against `gold` (ties: the higher threshold, i.e. the more
    precise memory), and the precision / recall / F1 of every candidate.

    `scored`: the (triple, confidence) pairs a memory-write model wrote on development documents whose gold
    triples are `gold` (`decode.corpus_writer.WriteStats.scored`); a triple counts as written at threshold t when one
    of its writes has confidence >= t, as the memory keeps a triple once. A candidate None keeps every triple (the
    lowest threshold)."""
    scored, gold = list(scored), list(gold)
    floor = lambda t: -float("inf") if t is None else t  # noqa: E731
    rows = [{"min_confidence": t, **write_agreement([x for x, c in scored if c >= floor(t)], gold)}
            for t in sorted(set(candidates), key=floor)]
    if not rows:
        raise ValueError("choose_min_confidence needs at least one candidate threshold")
    best = max(rows, key=lambda r: (r["f1"], floor(r["min_confidence"])))
    return best["min_confidence"], rows
