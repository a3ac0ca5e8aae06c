"""Prefill: tokens appended to rows of an existing KV cache in bucketed jitted calls (`prefill`), rows of very
different lengths in groups (`prefill_calls`), and a batch whose prompts share token prefixes prefilled once per
prefix (`prefill_shared`).

Shared prefixes: prefill a batch whose prompts share token prefixes once per prefix, not once per row.

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
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memllm_jax.decode.graph import host, merge
from memllm_jax.decode.shapes import MIN_BUCKET, bucket, doubled
from memllm_jax.tokenizer import common_prefix


def _last_logits(model, tokens_BxL, positions_BxL, mask_BxL, cache, last_B):
    """The logits after token `last_B[b]` of each row, and the updated cache. A `Decoder` runs its LM head there
    only (at every position the head is a fifth of a 135M model's prefill FLOPs); other models (the tests'
    scripted ones) give logits everywhere."""
    from memllm_jax.model.decoder import Decoder

    if isinstance(model, Decoder):
        hidden_BxLxD, cache = model(tokens_BxL, positions_BxL, mask_BxL, cache=cache, return_hidden=True)
        return model.head(jnp.take_along_axis(hidden_BxLxD, last_B[:, None, None], axis=1))[:, 0], cache
    logits_BxLxV, cache = model(tokens_BxL, positions_BxL, mask_BxL, cache=cache)
    return jnp.take_along_axis(logits_BxLxV, last_B[:, None, None], axis=1)[:, 0], cache


def _prefill_impl(graphdef, params, cache, logits_BxV, tokens_BxL, n_B, attend=None):
    """`attend`: run the model on the first `attend` slots of the cache only (every row's length after
    this prefill fits in them; later slots are neither read nor written), then put them back. Prefill
    attention is batched (B x K) small matmuls, slow on CPU, so a 128-token prompt in a 192-slot cache
    should not attend to 192 slots."""
    model = merge(graphdef, params)
    full = cache
    if attend is not None:
        cache = full.first_slots(attend)
    L = tokens_BxL.shape[1]
    mask_BxL = jnp.arange(L)[None, :] < n_B[:, None]
    positions_BxL = cache.lengths_B[:, None] + jnp.arange(L, dtype=jnp.int32)[None, :]
    last_BxV, cache = _last_logits(model, tokens_BxL, positions_BxL, mask_BxL, cache, jnp.maximum(n_B - 1, 0))
    if attend is not None:
        cache = full.with_first_slots(cache)
    return cache, jnp.where((n_B > 0)[:, None], last_BxV, logits_BxV)


_prefill = jax.jit(_prefill_impl, static_argnames=("graphdef", "attend"))
_prefill_donating = jax.jit(_prefill_impl, static_argnames=("graphdef", "attend"), donate_argnames=("cache",))
"""`_prefill` updating the given cache in place (no copy of the whole cache per call); the input cache is
invalid afterwards."""


def _attend_slots(lengths_B: np.ndarray, n: np.ndarray, L: int, max_len: int) -> int | None:
    """Slots a prefill of `n` tokens per row after `lengths_B` cached ones must see: the prefill width when every
    row is empty (a fresh prompt), else the next power of two >= the longest resulting row; None = the whole
    cache."""
    need = int((lengths_B + n).max(initial=0))
    attend = L if need <= L else doubled(need, MIN_BUCKET)
    return attend if attend < max_len else None


MAX_PREFILL = 256
"""Longest prefill call: longer inputs go in pieces (bounds the B x L x V logits of one call)."""
MIN_GROUP = 8
"""Fewest rows of a prefill call on some of the cache's rows (`prefill_calls`)."""
CALL_COST_TOKENS = 64
"""What one more prefill call costs, counted in padded tokens (dispatch, and copying its rows of the cache)."""


class PrefillCall(NamedTuple):
    """One jitted prefill call: `rows` (cache rows, `B` marking a padding row; None = every row, in place), each
    fed up to `width` tokens, attending to the first `attend` cache slots (None = all)."""

    rows: np.ndarray | None
    width: int
    attend: int | None


def prefill_calls(lengths_B: np.ndarray, n_B: np.ndarray, max_len: int) -> list[PrefillCall]:
    """How `prefill` runs `n_B[b]` (<= MAX_PREFILL) new tokens after `lengths_B[b]` cached ones in a cache of
    `max_len` slots. Prefill is compute-bound here, so every row costs the call's (bucketed) width: one call over
    all rows pads a 35-token prompt to the 129-token one's width (160) and computes the empty rows too. Instead the
    non-empty rows, sorted by length, can go in groups of g rows (a power of two >= MIN_GROUP, below the batch),
    each group at its own width; this picks whichever computes the fewest tokens (+ CALL_COST_TOKENS a call)."""
    B = len(n_B)
    width = bucket(int(n_B.max(initial=1)), cap=max_len)
    best = [PrefillCall(None, width, _attend_slots(lengths_B, n_B, width, max_len))]
    best_cost = B * width + CALL_COST_TOKENS
    order = np.argsort(-n_B, kind="stable")[:int((n_B > 0).sum())]  # non-empty rows, longest first
    g = MIN_GROUP
    while g < B and len(order):
        calls = []
        for start in range(0, len(order), g):
            rows = order[start:start + g]
            w = bucket(int(n_B[rows].max()), cap=max_len)
            calls.append(PrefillCall(np.concatenate([rows, np.full(g - len(rows), B)]), w,
                                     _attend_slots(lengths_B[rows], n_B[rows], w, max_len)))
        cost = sum(g * c.width + CALL_COST_TOKENS for c in calls)
        if cost < best_cost:
            best, best_cost = calls, cost
        g *= 2
    return best


def prefill(graphdef, params, cache, logits_BxV, rows: Sequence[Sequence[int]], pad_id: int = 0,
            donate: bool = False):
    """Append `rows[b]` (may be empty) to each row's cache; returns the cache and the logits of the next
    token (unchanged for rows with nothing to append). The length is bucketed, so repeated memory round
    trips reuse a few compiled shapes; rows of very different lengths go in groups (`prefill_calls`; the
    model's stacked `KVCache` only). `donate`: the given cache's buffers are updated in place and must not be
    used afterwards."""
    from memllm_jax.model.decoder import KVCache

    longest = max((len(r) for r in rows), default=0)
    if longest > MAX_PREFILL:
        for start in range(0, longest, MAX_PREFILL):
            piece = [list(r[start : start + MAX_PREFILL]) for r in rows]
            cache, logits_BxV = prefill(graphdef, params, cache, logits_BxV, piece, pad_id, donate)
        return cache, logits_BxV
    n = np.array([len(r) for r in rows], np.int32)
    if not isinstance(cache, KVCache) or isinstance(cache.k_LxBxKxHxS, (tuple, list)):
        calls = [PrefillCall(None, bucket(int(n.max(initial=1)), cap=getattr(cache, "max_len", None)), None)]
    else:
        calls = prefill_calls(host(cache.lengths_B), n, cache.max_len)
    B = len(rows)
    for call in calls:
        picked = np.arange(B) if call.rows is None else call.rows
        n_G = np.array([n[b] if b < B else 0 for b in picked], np.int32)
        tokens = np.full((len(picked), call.width), pad_id, np.int32)
        for i, b in enumerate(picked):
            if b < B:
                tokens[i, : n[b]] = rows[b]
        if call.rows is None:
            run = _prefill_donating if donate else _prefill
            cache, logits_BxV = run(graphdef, params, cache, logits_BxV, tokens, n_G, attend=call.attend)
        else:
            run = _prefill_rows_donating if donate else _prefill_rows
            cache, logits_BxV = run(graphdef, params, cache, logits_BxV, jnp.asarray(call.rows, jnp.int32), tokens,
                                    n_G, attend=call.attend)
            donate = True  # the cache is this function's own from here on
    return cache, logits_BxV


def _prefill_rows_impl(graphdef, params, cache, logits_BxV, rows_G, tokens_GxL, n_G, attend=None):
    """`_prefill_impl` on cache rows `rows_G` only (an index >= B is a padding row: read as empty, not written)."""
    part = cache.take_rows(rows_G)
    part_logits = jnp.take(logits_BxV, rows_G, axis=0, mode="fill", fill_value=0)
    part, part_logits = _prefill_impl(graphdef, params, part, part_logits, tokens_GxL, n_G, attend)
    return cache.put_rows(rows_G, part), logits_BxV.at[rows_G].set(part_logits, mode="drop")


_prefill_rows = jax.jit(_prefill_rows_impl, static_argnames=("graphdef", "attend"))
_prefill_rows_donating = jax.jit(_prefill_rows_impl, static_argnames=("graphdef", "attend"),
                                 donate_argnames=("cache", "logits_BxV"))



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
    from memllm_jax.model.decoder import KVCache

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
    from memllm_jax.model.decoder import KVCache

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

