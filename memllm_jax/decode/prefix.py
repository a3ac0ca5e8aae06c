"""Prefill a batch whose prompts share token prefixes once per prefix, not once per row.

Memory-write prompts of one document share their pretext: with the pretext window (default 10 sentences)
not yet sliding, sentence i's prompt `BOS + S_<i + ({USER_ST}) s_i ...` starts with everything sentence
i-1's prompt has before its `({USER_ST})`. A causal model's keys/values for a common token prefix at the
same positions are the same in every row, so the batch is prefilled in two calls:

1. the *trunk* rows (a document's longest prompt) are prefilled in a small cache of their own;
2. every row takes the trunk's keys/values for the prefix it shares (a gather on the batch axis) and
   prefills only its own rest; a short row sharing nothing is prefilled whole here.

With no sharing at all this is one ordinary prefill. Only the model's `KVCache` is grafted; other caches use the plain prefill.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memllm_jax.decode.loop import prefill
from memllm_jax.tokenizer import common_prefix

MIN_SHARE = 16
"""Fewest shared tokens for a row to take its prefix from a trunk (below this it is prefilled whole)."""
MIN_SAVED = 64
"""Fewest prefill tokens saved in a batch for the two-call path to be used at all."""


@dataclasses.dataclass(frozen=True)
class SharePlan:
    trunks: tuple[int, ...]
    """Row indices prefilled whole in the first call."""
    src: tuple[int, ...]
    """Per row: its trunk's position in `trunks` (a trunk points at itself; rows sharing nothing: 0)."""
    shared: tuple[int, ...]
    """Per row: tokens taken from the trunk (a trunk: its whole prompt; rows prefilled whole in the second
    call, and rows not prefilled: 0)."""

    @property
    def saved(self) -> int:
        return sum(n for r, n in enumerate(self.shared) if r not in self.trunks)


def plan_sharing(rows: Sequence[Sequence[int]], n_active: int | None = None, min_share: int = MIN_SHARE) -> SharePlan:
    """Longest prompt first, a row takes the longest common prefix it has with a trunk (at most all but its
    last token, whose logits it must compute), or is prefilled whole in the second call (shared 0). Rows
    become trunks one at a time, the row with the longest rest first, and the plan with the least padded
    prefill work (trunks x their bucket + rows x the bucket of the longest rest) is kept: a document's longest prompt
    becomes its trunk, while a short prompt sharing nothing (a first sentence, with no pretext) is cheaper
    in the second call than as one more padded trunk row. Rows from `n_active` on (batch padding) are not
    prefilled."""
    from memllm_jax.decode.loop import bucket

    n_active = len(rows) if n_active is None else n_active
    arrays = [np.asarray(r, np.int64) for r in rows]
    order = sorted(range(n_active), key=lambda i: -len(arrays[i]))
    lcp: dict[tuple[int, int], int] = {}  # pairs are revisited by every promotion round

    def common(r: int, t: int) -> int:
        if (r, t) not in lcp:
            lcp[r, t] = min(common_prefix(arrays[r], arrays[t]), len(arrays[r]) - 1)
        return lcp[r, t]

    def assign(promoted: set[int]) -> tuple[list[int], list[int], list[int]]:
        trunks, src, shared = [], [0] * len(rows), [0] * len(rows)
        for r in order:
            if r in promoted:
                src[r], shared[r] = len(trunks), len(arrays[r])
                trunks.append(r)
                continue
            best, best_t = 0, 0
            for pos, t in enumerate(trunks):
                c = common(r, t)
                if c > best:
                    best, best_t = c, pos
            if best >= min_share:
                src[r], shared[r] = best_t, best
        return trunks, src, shared

    def rest(r: int, trunks, shared) -> int:
        return 0 if r in trunks else len(arrays[r]) - shared[r]

    def trunk_work(trunks) -> int:
        """Never decreases as rows are promoted (more trunks, none shorter), which bounds the search."""
        if not trunks:
            return 0
        return (1 << max(0, (len(trunks) - 1).bit_length())) * bucket(max(len(arrays[t]) for t in trunks))

    def cost(trunks, shared) -> int:
        longest_rest = max((rest(r, trunks, shared) for r in range(n_active)), default=0)
        return trunk_work(trunks) + (len(rows) * bucket(longest_rest) if longest_rest else 0)

    # promote along the sequence and keep the cheapest plan: one promotion alone may not pay (two long
    # documents: the second one's prompt still sets the rest width) while two do; stop once the trunks'
    # own work exceeds the best plan, as it only grows
    promoted: set[int] = set()
    plan = assign(promoted)
    best, best_cost = plan, cost(plan[0], plan[2])
    while len(plan[0]) < n_active and trunk_work(plan[0]) < best_cost:
        trunks, _, shared = plan
        promoted.add(max((r for r in range(n_active) if r not in trunks), key=lambda r: rest(r, trunks, shared)))
        plan = assign(promoted)
        plan_cost = cost(plan[0], plan[2])
        if plan_cost < best_cost:
            best, best_cost = plan, plan_cost
    return SharePlan(*(tuple(x) for x in best))


@jax.jit
def _graft(trunk, trunk_logits_TxV, src_B, shared_B, is_trunk_B):
    """Rows of a new cache: row b holds trunk `src_B[b]`'s first `shared_B[b]` slots (zeros after)."""
    from memllm_jax.model.mistral import KVCache

    keep_BxS = jnp.arange(trunk.max_len)[None, :] < shared_B[:, None]
    k = jnp.where(keep_BxS[None, :, None, None, :], jnp.take(trunk.k_LxBxKxHxS, src_B, axis=1), 0)
    v = jnp.where(keep_BxS[None, :, None, :, None], jnp.take(trunk.v_LxBxKxSxH, src_B, axis=1), 0)
    logits_BxV = jnp.where(is_trunk_B[:, None], jnp.take(trunk_logits_TxV, src_B, axis=0), 0.0)
    return KVCache(k, v, shared_B.astype(jnp.int32)), logits_BxV


def prefill_shared(graphdef, params, make_cache, max_len: int, vocab: int, rows: Sequence[Sequence[int]],
                   n_active: int | None = None, plan: SharePlan | None = None):
    """A fresh cache of `len(rows)` rows x `max_len` slots holding `rows[b]` for b < n_active (later rows
    stay empty), and each row's next-token logits; equal to `prefill` of the whole rows up to float
    rounding."""
    from memllm_jax.model.mistral import KVCache

    B = len(rows)
    n_active = B if n_active is None else n_active
    cache = make_cache(B, max_len)
    plan = plan_sharing(rows, n_active) if plan is None else plan
    if not isinstance(cache, KVCache) or plan.saved < MIN_SAVED:
        active = [list(r) if b < n_active else [] for b, r in enumerate(rows)]
        return prefill(graphdef, params, cache, jnp.zeros((B, vocab)), active)
    T = 1 << max(0, (len(plan.trunks) - 1).bit_length())  # a power of two: few compiled shapes
    trunk_rows = [list(rows[t]) for t in plan.trunks] + [[]] * (T - len(plan.trunks))
    trunk, trunk_logits = prefill(graphdef, params, make_cache(T, max_len), jnp.zeros((T, vocab)), trunk_rows)
    is_trunk = np.zeros(B, bool)
    is_trunk[list(plan.trunks)] = True
    cache, logits = _graft(trunk, trunk_logits, jnp.asarray(plan.src, jnp.int32), jnp.asarray(plan.shared, jnp.int32),
                           jnp.asarray(is_trunk))
    rest = [list(rows[b][plan.shared[b]:]) if b < n_active and not is_trunk[b] else [] for b in range(B)]
    return prefill(graphdef, params, cache, logits, rest)

