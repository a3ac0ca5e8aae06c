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


def write_agreement(written: Iterable[dict | protocol.Triple], gold: Iterable[protocol.Triple]) -> dict:
    """Precision / recall / F1 of written triples (memory records or Triples) against gold Triples."""
    def key(t):
        return _key(t["subject"], t["relation"], t["object"]) if isinstance(t, dict) else _key(t.subject, t.relation, t.object)

    written_keys, gold_keys = {key(t) for t in written}, {key(t) for t in gold}
    hit = len(written_keys & gold_keys)
    precision = hit / len(written_keys) if written_keys else 0.0
    recall = hit / len(gold_keys) if gold_keys else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
    return {"written_unique": len(written_keys), "gold_unique": len(gold_keys), "correct": hit,
            "precision": precision, "recall": recall, "f1": f1}
