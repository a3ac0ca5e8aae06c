"""The paper's per-token mixture (§4.2, footnote 3) and span perplexities.

Path semantics (what a token is conditioned on). Evaluation follows one decoding path through a document:
the context of text token i is the document text before i plus the most recent memory read placed before i
(a new read replaces the previous one, paper §3.2; a read whose result is empty or too large is removed, so
its context is the text alone). At a read position i the paper's mixture is used:

    p(w_i) = p(w_i | w_<i, MR) p(MR | w_<i) + p(w_i | w_<i) (1 - p(MR | w_<i))

where the no-read branch `p(w_i | w_<i)` and `p(MR | w_<i)` (the probability of the `({MEM_READ(` token,
the token that opens a read) are taken in the path context *before* the read (text plus the previous read),
and the read branch `p(w_i | w_<i, MR)` in the context text + this read's call and result. Tokens after the
read position (up to and including the token before the next read) are scored in the with-read context,
without a mixture: the read happened on this path. Elsewhere `p(MR | ·)` plays no role (footnote 3:
`p(w_i | w_<i, MR)` is zero where no read actually occurs), so the no-read probability is used as is, not
renormalised over non-marker tokens.

Perplexities are corpus-level: exp(sum of token NLLs / number of tokens) over all documents, for OVERALL
(every text token; API tokens are never part of the scored sequence), TARGET (tokens overlapping a target
entity span) and ENTITY (tokens overlapping any entity mention span).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping, Sequence

import numpy as np


def mix_logprobs(logp_path_T: np.ndarray, logp_read_T: np.ndarray, logp_mr_T: np.ndarray,
                 read_T: np.ndarray) -> np.ndarray:
    """log p(w_i) for every text token: the mixture at read positions, the path probability elsewhere.

    logp_path_T: log p(w_i | path context without a read at i); logp_read_T: log p(w_i | w_<i, read at i)
    (ignored where `read_T` is False); logp_mr_T: log p(MR | path context before i); read_T: bool.
    """
    logp_path_T = np.asarray(logp_path_T, np.float64)
    read_T = np.asarray(read_T, bool)
    lr = np.where(read_T, np.asarray(logp_read_T, np.float64), 0.0)
    lmr = np.minimum(np.where(read_T, np.asarray(logp_mr_T, np.float64), -1.0), 0.0)
    with np.errstate(divide="ignore"):
        log_not_mr = np.where(lmr < -1e-12, np.log(-np.expm1(lmr)), -np.inf)  # log(1 - p(MR))
    mixed = np.logaddexp(lr + lmr, logp_path_T + log_not_mr)
    return np.where(read_T, mixed, logp_path_T)


def char_spans_to_token_mask(offsets: Sequence[tuple[int, int]], spans: Iterable[tuple[int, int]]) -> np.ndarray:
    """True for every token whose character range [s, e) overlaps one of the character spans [a, b)."""
    mask = np.zeros(len(offsets), bool)
    spans = [(int(a), int(b)) for a, b in spans if b > a]
    if not spans or not len(offsets):
        return mask
    starts = np.array([s for s, _ in offsets])
    ends = np.array([e for _, e in offsets])
    for a, b in spans:
        mask |= (np.maximum(starts, a) < np.minimum(ends, b))
    return mask


def char_to_token_index(offsets: Sequence[tuple[int, int]], char_pos: int) -> int:
    """Index of the first token that ends after `char_pos` (the token a read placed at `char_pos` precedes)."""
    for i, (_, e) in enumerate(offsets):
        if e > char_pos:
            return i
    return len(offsets)


@dataclasses.dataclass
class SpanNLL:
    """Summed negative log-likelihood (nats) and token count for each span kind."""

    nll: dict[str, float] = dataclasses.field(default_factory=dict)
    count: dict[str, int] = dataclasses.field(default_factory=dict)

    def add(self, other: "SpanNLL") -> "SpanNLL":
        for k in set(self.nll) | set(other.nll):
            self.nll[k] = self.nll.get(k, 0.0) + other.nll.get(k, 0.0)
            self.count[k] = self.count.get(k, 0) + other.count.get(k, 0)
        return self

    def perplexities(self) -> dict[str, float]:
        return {k: (math.exp(self.nll[k] / self.count[k]) if self.count[k] else float("nan")) for k in self.nll}


def span_nll(logp_T: np.ndarray, masks: Mapping[str, np.ndarray]) -> SpanNLL:
    """NLL sums and counts of `logp_T` under each boolean mask (e.g. overall / target / entity)."""
    logp_T = np.asarray(logp_T, np.float64)
    out = SpanNLL()
    for name, mask in masks.items():
        mask = np.asarray(mask, bool)
        if mask.shape != logp_T.shape:
            raise ValueError(f"mask {name!r} has shape {mask.shape}, log-probs have {logp_T.shape}")
        out.nll[name] = float(-logp_T[mask].sum())
        out.count[name] = int(mask.sum())
    return out


def corpus_perplexities(per_doc: Iterable[SpanNLL]) -> dict[str, float]:
    """Token-weighted corpus perplexity per span kind."""
    total = SpanNLL()
    for d in per_doc:
        total.add(d)
    return total.perplexities()
