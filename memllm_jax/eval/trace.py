"""Read traces: what the perplexity evaluation did on one document, as JSON for the HTML report.

A trace lists the document's tokens (their text, whether they are TARGET / ENTITY tokens, the loss in nats
with the row's memory reads and without any read: the same model's plain forward) and every read: where it
was made, the call text, its queries, the results, the gold queries and targets, and its fate. A read whose
call did not close or whose result was empty is removed at once (paper §3.2: the text continues as if it had
not been made); a read with results conditions the text up to the next read, where it is removed before the
next read's queries are generated. `evaluate_perplexity(..., trace_docs=N)` returns the traces of its first
N documents (no extra model work: the losses are the ones the evaluation computes anyway).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from memllm_jax import protocol

USED, NOT_CLOSED, NO_QUERIES, EMPTY = "used", "call not closed", "no queries", "empty result"


def _query_text(q: protocol.Query) -> str:
    return f"<{q.subject or '*'}, {q.relation}, {q.object or '*'}>"


def read_event(tok: Any, pos: int, call_ids: Sequence[int], queries: Sequence[protocol.Query],
               results: Sequence[str], gold: Any) -> dict:
    """One read of a traced document (before removal: `call_ids` as generated or given)."""
    if not call_ids:
        status = NO_QUERIES if not queries else NOT_CLOSED
    else:
        status = USED if results else EMPTY
    targets = list(gold.targets) if gold is not None else []
    return {
        "token": int(pos),
        "call": tok.decode(call_ids) if call_ids else "",
        "queries": [_query_text(q) for q in queries],
        "results": list(results),
        "status": status,
        "gold_queries": [_query_text(q) for q in gold.queries] if gold is not None else [],
        "targets": targets,
        "target_hit": bool(targets) and any(t in results for t in targets),
    }


def token_texts(text: str, offsets: Sequence[tuple[int, int]]) -> list[str]:
    """Each token's piece of `text`, gaps between tokens given to the token after them, so the pieces
    concatenate to the text up to the last token."""
    starts = [0] + [int(s) for s, _ in offsets[1:]]
    ends = [int(s) for s, _ in offsets[1:]] + [int(offsets[-1][1])] if offsets else []
    return [text[a:b] for a, b in zip(starts, ends)]


def doc_trace(enc: Any, logp_with_T: np.ndarray, logp_without_T: np.ndarray, events: Sequence[dict]) -> dict:
    """The trace of one document (`enc`: an `EncodedDoc`) from its per-token log-probabilities."""
    pieces = token_texts(enc.doc.text, enc.offsets)
    events = sorted(events, key=lambda e: e["token"])
    used = [e for e in events if e["status"] == USED]
    for k, e in enumerate(used):
        nxt = used[k + 1]["token"] if k + 1 < len(used) else None
        e["until"] = nxt if nxt is not None else len(pieces)
    return {
        "doc": enc.doc.doc_id,
        "tokens": [protocol.unescape_text(p) for p in pieces],
        "loss_with": [round(float(-x), 4) for x in logp_with_T],
        "loss_without": [round(float(-x), 4) for x in logp_without_T],
        "target": [bool(x) for x in enc.masks["target"]],
        "entity": [bool(x) for x in enc.masks["entity"]],
        "reads": list(events),
    }


def summarize(trace: dict) -> dict[str, float]:
    """Mean loss (nats / token) with and without memory over TARGET tokens and all tokens of a trace."""
    w, wo, t = (np.asarray(trace[k], float) for k in ("loss_with", "loss_without", "target"))
    t = t.astype(bool)
    mean = lambda x, m: float(x[m].mean()) if m.any() else float("nan")  # noqa: E731
    every = np.ones_like(t)
    return {"target_with": mean(w, t), "target_without": mean(wo, t), "all_with": mean(w, every),
            "all_without": mean(wo, every)}
