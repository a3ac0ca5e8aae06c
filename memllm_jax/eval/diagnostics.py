"""What the trained memory models have learned, measured directly on held-out examples.

`field_losses`: teacher-forced loss and accuracy of a model on the API calls of held-out write / read examples,
split by field: **name** tokens (a triple's subject or object, a query's entity), **relation** tokens and
**markup** (separators, call ends). The names of a held-out document are new to the model, so its name
accuracy is a copy probe: `name_exact` is the fraction of names whose every token is the model's top choice,
i.e. names it would reproduce from the context when generating greedily.

`names_in_text`: the fraction of entity names a model wrote (or queried) that occur verbatim in the text it
read: a model that copies writes names from its input; one that recalls writes names memorised in training.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable, Sequence

import numpy as np

from memllm_jax import protocol

MARKUP, NAME, RELATION = 0, 1, 2
FIELD_KINDS = {"markup": MARKUP, "name": NAME, "relation": RELATION}


def call_char_labels(call: str) -> np.ndarray:
    """Per character of a write or read call string, MARKUP / NAME / RELATION.

    A write call's items are `subject>>relation>>object`; a read call's are `subject>>relation>>object` with one
    of the entities empty. Separators, opening and closing markers are markup.
    """
    labels = np.zeros(len(call), np.int8)
    for opener, closer in ((protocol.MEM_WRITE, protocol.CALL_END), (protocol.MEM_READ, protocol.READ_END)):
        if call.startswith(opener):
            break
    else:
        return labels
    body_start = len(opener)
    body_end = call.rfind(closer)
    body_end = len(call) if body_end < body_start else body_end
    pos = body_start
    for item in call[body_start:body_end].split(protocol.ITEM_SEP):
        field_start = pos
        for k, field in enumerate(item.split(protocol.FIELD_SEP)):
            kind = RELATION if k == 1 else NAME
            labels[field_start:field_start + len(field)] = kind
            field_start += len(field) + len(protocol.FIELD_SEP)
        pos += len(item) + len(protocol.ITEM_SEP)
    return labels


def _token_labels(call_labels: np.ndarray, offsets: Sequence[tuple[int, int]]) -> np.ndarray:
    """A token's label is that of its characters (relation over name over markup when it straddles fields)."""
    out = np.zeros(len(offsets), np.int8)
    for i, (a, b) in enumerate(offsets):
        seg = call_labels[a:b]
        out[i] = RELATION if (seg == RELATION).any() else NAME if (seg == NAME).any() else MARKUP
    return out


@dataclasses.dataclass
class FieldStats:
    nll: dict[str, float] = dataclasses.field(default_factory=lambda: {k: 0.0 for k in FIELD_KINDS})
    correct: dict[str, int] = dataclasses.field(default_factory=lambda: {k: 0 for k in FIELD_KINDS})
    count: dict[str, int] = dataclasses.field(default_factory=lambda: {k: 0 for k in FIELD_KINDS})
    names: int = 0
    names_exact: int = 0

    def to_json(self) -> dict:
        out: dict[str, Any] = {}
        for k in FIELD_KINDS:
            n = max(1, self.count[k])
            out[k] = {"tokens": self.count[k], "loss": self.nll[k] / n, "accuracy": self.correct[k] / n}
        out["names"] = self.names
        out["name_exact"] = self.names_exact / max(1, self.names)
        return out


def field_losses(model: Any, tok: Any, records: Iterable[dict], *, batch_size: int = 8,
                 max_records: int | None = None) -> dict:
    """Field-split loss / accuracy on the API calls of `records` (write or read examples: `segments` of text
    with loss flags, as in data/train/*.jsonl). Only loss segments that are calls are scored."""
    from memllm_jax.eval.records import encode_with_offsets
    from memllm_jax.eval.scoring import Scorer

    seqs, spans = [], []  # spans: per sequence, (start token, token labels, name ids) of each call
    for k, rec in enumerate(records):
        if max_records is not None and k >= max_records:
            break
        ids, calls = [tok.bos_id], []
        for seg in rec["segments"]:
            text = seg["text"]
            seg_ids, offsets = encode_with_offsets(tok, text)
            if seg.get("loss") and text.startswith((protocol.MEM_WRITE, protocol.MEM_READ)):
                labels = _token_labels(call_char_labels(text), offsets)
                calls.append((len(ids), labels))
            ids += seg_ids
        seqs.append(ids)
        spans.append(calls)
    stats = FieldStats()
    scorer = Scorer(model, tok.marker_id[protocol.MEM_READ], batch_size=batch_size, pad_id=tok.pad_id)
    for seq, calls, scores in zip(seqs, spans, scorer.score(seqs)):
        for start, labels in calls:
            # token j of the call is predicted at position start + j - 1
            lp = scores.lp_next[start - 1:start - 1 + len(labels)]
            ok = scores.argmax[start - 1:start - 1 + len(labels)] == np.asarray(seq[start:start + len(labels)])
            for name, kind in FIELD_KINDS.items():
                sel = labels == kind
                stats.nll[name] += float(-lp[sel].sum())
                stats.correct[name] += int(ok[sel].sum())
                stats.count[name] += int(sel.sum())
            run_ok = None  # one name = one maximal run of NAME tokens
            for lab, good in zip(labels, ok):
                if lab == NAME:
                    run_ok = bool(good) if run_ok is None else (run_ok and bool(good))
                elif run_ok is not None:
                    stats.names += 1
                    stats.names_exact += run_ok
                    run_ok = None
            if run_ok is not None:
                stats.names += 1
                stats.names_exact += run_ok
    return stats.to_json()


def _norm(name: str) -> str:
    return " ".join(name.split()).lower()


def names_in_text(names: Iterable[str], text: str) -> dict:
    """How many of `names` (non-empty) occur in `text` as whole words, case- and whitespace-insensitively."""
    hay = " ".join(text.split()).lower()
    names = [n for n in (_norm(x) for x in names) if n]
    hits = sum(re.search(r"(?<!\w)" + re.escape(n) + r"(?!\w)", hay) is not None for n in names)
    return {"names": len(names), "in_text": hits, "fraction": hits / max(1, len(names))}
