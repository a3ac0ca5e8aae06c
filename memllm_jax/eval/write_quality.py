"""How well a memory-write model's triples agree with the gold triples of the same documents.

Names are compared case- and whitespace-insensitively; a written triple counts as correct when the exact
(subject, relation, object) is among the gold triples. Coreference makes this strict: "She" written instead
of the person's name is wrong, as it would be useless to a later read.
"""

from __future__ import annotations

from typing import Iterable

from memllm_jax import protocol


def _key(subject: str, relation: str, obj: str) -> tuple[str, str, str]:
    return tuple(" ".join(x.lower().split()) for x in (subject, relation, obj))  # type: ignore[return-value]


def triple_key(t: dict | protocol.Triple) -> tuple[str, str, str]:
    """What a triple (a memory record or a Triple) is compared by: its names, lower-cased, whitespace normalised."""
    return _key(t["subject"], t["relation"], t["object"]) if isinstance(t, dict) else _key(t.subject, t.relation, t.object)


def write_agreement(written: Iterable[dict | protocol.Triple], gold: Iterable[protocol.Triple]) -> dict:
    """Precision / recall / F1 of written triples (memory records or Triples) against gold Triples."""
    written_keys, gold_keys = {triple_key(t) for t in written}, {triple_key(t) for t in gold}
    hit = len(written_keys & gold_keys)
    precision = hit / len(written_keys) if written_keys else 0.0
    recall = hit / len(gold_keys) if gold_keys else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
    return {"written_unique": len(written_keys), "gold_unique": len(gold_keys), "correct": hit,
            "precision": precision, "recall": recall, "f1": f1}


def threshold_label(min_confidence: float | None) -> str:
    """A confidence threshold as printed in reports: "any" for None (every triple kept)."""
    return "any" if min_confidence is None else str(min_confidence)


def choose_min_confidence(scored: Iterable[tuple[protocol.Triple, float]], gold: Iterable[protocol.Triple],
                          candidates: Iterable[float | None]) -> tuple[float | None, list[dict]]:
    """The confidence threshold with the highest F1 against `gold` (ties: the higher threshold, i.e. the more
    precise memory), and the precision / recall / F1 of every candidate.

    `scored`: the (triple, confidence) pairs a memory-write model wrote on development documents whose gold
    triples are `gold` (`decode.writer.WriteStats.scored`); a triple counts as written at threshold t when one
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
