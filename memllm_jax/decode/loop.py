"""Jitted building blocks: bucketed prefill into an existing cache, and the chunked read-decoding loop.

The model crosses the jit boundary split into `graphdef` (static) and `params` (a pytree), and is merged
inside the traced function. The loop object on the host keeps only hashable static fields; everything that
changes lives in a `DecodeState` pytree.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memllm_jax.decode import state as st
from memllm_jax.decode.sampling import NEG_INF, SamplingConfig, choose

MIN_BUCKET = 8


def bucket(n: int, cap: int | None = None) -> int:
    """Smallest value >= n of 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ... (four steps per power of two, at
    least MIN_BUCKET): few distinct prefill shapes, and at most ~1/5 of a prefill is padding (plain
    powers of two waste up to half, e.g. 129 tokens -> 256; prefill is compute-bound, so padding costs
    its full share)."""
    b = MIN_BUCKET
    while b < n:
        b += 1 << max(0, (b.bit_length() - 1) - 2)
    return b if cap is None else max(min(b, cap), n)


def _last_logits(model, tokens_BxL, positions_BxL, mask_BxL, cache, last_B):
    """The logits after token `last_B[b]` of each row, and the updated cache. A `Mistral` runs its LM head there
    only (at every position the head is a fifth of a 135M model's prefill FLOPs); other models (the tests'
    scripted ones) give logits everywhere."""
    from memllm_jax.model.mistral import Mistral

    if isinstance(model, Mistral):
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
    attend = L if need <= L else MIN_BUCKET
    while attend < need:
        attend *= 2
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
    from memllm_jax.model.mistral import KVCache

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


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """Static settings of the read loop (hashable)."""

    chunk: int
    """Most tokens generated per loop exit."""
    eos_id: int
    read_open_id: int
    """The `({MEM_READ(` marker id."""
    read_end_id: int
    """The `)-->` marker id."""
    max_len: int
    """Slots usable in the cache; a row reaching it stops with status FULL."""
    sampling: SamplingConfig = SamplingConfig()
    pad_id: int = 0
    exit_paused: int = 1
    """Exit once this many rows wait for the host (paused rows idle until the next exit, so a batch
    should not wait for the whole chunk; exiting at every single pause costs a host round trip each)."""
    answer_width: int = 0
    """0: reads are served by the host at loop exits (`READ_PAUSE` / `OPEN_PAUSE` exit the loop). > 0: reads
    are served inside the loop by a host callback (`read_chunk(server=...)`), and this is the width F of
    each row's forced-token queue (`DecodeState.forced_BxF`); longer feeds go through `HOST_FEED`."""
    stop_ids: tuple[int, ...] = ()
    """Tokens that end a row (status DONE, the token kept) when sampled outside a call, e.g. the tokens holding
    a clause end when only the first clause of the text is wanted."""
    host_callback: str = "auto"
    """In-loop reads: how the loop calls the host, "buffer" (`jax.experimental.buffer_callback`, CPU and GPU),
    "io" (`jax.experimental.io_callback`, every backend) or "auto" (buffer where supported)."""


def _layered(cache: Any, model: Any) -> Any:
    """Per-layer cache buffers for the loop carry of an unrolled model (see `mistral.unstack_cache`). A scanned
    model (`ModelConfig.scan_layers`) scans over the stacked cache, so it stays stacked: slower for the tiny
    CPU models (1.1-2x per token), but only one layer's gathered weights are live at a time (a 7B decode step
    on fsdp 8 would otherwise hold every layer's). `split_model` gives small single-device scanned models to
    the loops unrolled."""
    from memllm_jax.model.mistral import KVCache, unstack_cache

    if not isinstance(cache, KVCache) or getattr(getattr(model, "cfg", None), "scan_layers", False):
        return cache
    return unstack_cache(cache)


def _stacked(cache: Any) -> Any:
    from memllm_jax.model.mistral import KVCache, stack_cache

    return stack_cache(cache) if isinstance(cache, KVCache) else cache


def _read_step(model, spec: LoopSpec, s: st.DecodeState) -> st.DecodeState:
    """One token per row: a sampled one for RUNNING rows, or (in-loop reads) the next queued forced token.
    Forced tokens (answers, re-fed text) are context the host chose: they are not written to `out_BxC`, do not
    count against the budget and set no status."""
    B, V = s.logits_BxV.shape
    running_B = s.status_B == st.RUNNING
    # Greedy choice draws nothing: no key split (a threefry call per step).
    rng, sub = (s.rng, s.rng) if spec.sampling.greedy else jax.random.split(s.rng)
    banned_BxV = s.ban_read_B[:, None] & (jnp.arange(V)[None, :] == spec.read_open_id)
    tok_B = choose(jnp.where(banned_BxV, NEG_INF, s.logits_BxV), sub, spec.sampling)
    tok_B = jnp.where(running_B, tok_B, spec.pad_id)
    sample_B = feed_B = running_B
    if spec.answer_width:
        forcing_B = s.forced_pos_B < s.forced_len_B
        sample_B = running_B & ~forcing_B
        feed_B = sample_B | forcing_B
        F = s.forced_BxF.shape[1]
        forced_B = jnp.take_along_axis(s.forced_BxF, jnp.minimum(s.forced_pos_B, F - 1)[:, None], axis=1)[:, 0]
        tok_B = jnp.where(forcing_B, forced_B, tok_B)
        s = s.replace(forced_pos_B=s.forced_pos_B + forcing_B.astype(jnp.int32))
    logits_Bx1xV, cache = model(tok_B[:, None], s.cache.lengths_B[:, None], feed_B[:, None], cache=s.cache)
    logits_BxV = jnp.where(feed_B[:, None], logits_Bx1xV[:, 0], s.logits_BxV)
    C = s.out_BxC.shape[1]
    out_BxC = s.out_BxC.at[jnp.arange(B), jnp.where(sample_B, s.n_out_B, C)].set(tok_B, mode="drop")
    step_B = sample_B.astype(jnp.int32)
    budget_B = s.budget_B - step_B
    opens_B = sample_B & (tok_B == spec.read_open_id)
    closes_B = sample_B & (tok_B == spec.read_end_id) & s.in_call_B
    status_B = s.status_B
    status_B = jnp.where(sample_B & (budget_B <= 0), st.BUDGET, status_B)
    status_B = jnp.where(sample_B & (cache.lengths_B >= spec.max_len), st.FULL, status_B)
    status_B = jnp.where(opens_B & (s.active_call_B | s.in_call_B), st.OPEN_PAUSE, status_B)
    status_B = jnp.where(closes_B, st.READ_PAUSE, status_B)
    if spec.stop_ids:
        done_B = sample_B & ~s.in_call_B & jnp.isin(tok_B, jnp.asarray(spec.stop_ids, jnp.int32))
        status_B = jnp.where(done_B, st.DONE, status_B)
    status_B = jnp.where(sample_B & (tok_B == spec.eos_id), st.EOS, status_B)
    return s.replace(
        cache=cache,
        logits_BxV=logits_BxV,
        out_BxC=out_BxC,
        n_out_B=s.n_out_B + step_B,
        status_B=status_B,
        budget_B=budget_B,
        in_call_B=(s.in_call_B | opens_B) & ~closes_B,
        ban_read_B=s.ban_read_B & ~sample_B,
        rng=rng,
    )


# ------------------------------------------------------------------------------------- in-loop reads

_SERVERS: dict[int, Any] = {}
_NEXT_SERVER = [0]


def register_server(server: Any) -> int:
    """Make `server.serve(...)` (see `_serve_reads`) callable from the jitted loop; returns its id, which
    `read_chunk` takes. The loop is compiled once for every server: the callback looks the server up by id."""
    _NEXT_SERVER[0] += 1
    _SERVERS[_NEXT_SERVER[0]] = server
    return _NEXT_SERVER[0]


def release_server(server_id: int) -> None:
    _SERVERS.pop(server_id, None)


def _dispatch(server_id, packed_Bx6pC):
    """The callback's host side: unpack `_pack_request`, run the server, pack its answer as `_call_server`
    unpacks it."""
    packed_Bx6pC = np.asarray(packed_Bx6pC)
    status, n_out, lengths, budget, in_call, active = packed_Bx6pC[:, :6].T
    out_BxC = packed_Bx6pC[:, 6:]
    status, lengths, forced_BxF, n_forced, ban, in_call, active = _SERVERS[int(server_id)].serve(
        status, out_BxC, n_out, lengths, budget, in_call.astype(bool), active.astype(bool))
    columns = np.stack([status, lengths, n_forced, ban, in_call, active], axis=1).astype(np.int32)
    return np.concatenate([columns, np.asarray(forced_BxF, np.int32)], axis=1)


class _ServedRows(NamedTuple):
    """The per-row fields the read callback reads or sets (the `lax.cond` operand: no KV cache)."""

    status_B: jax.Array
    n_out_B: jax.Array
    lengths_B: jax.Array
    budget_B: jax.Array
    in_call_B: jax.Array
    active_B: jax.Array
    out_BxC: jax.Array
    forced_BxF: jax.Array
    forced_len_B: jax.Array
    ban_B: jax.Array


def _pack_request(rows: _ServedRows) -> jax.Array:
    """int32 B x (6 + C): status, n_out, cache length, budget, in_call, active, then `out_BxC`. The callback
    moves one array each way: each operand or result of a callback costs a host transfer of its own."""
    columns = [rows.status_B, rows.n_out_B, rows.lengths_B, rows.budget_B, rows.in_call_B, rows.active_B]
    return jnp.concatenate([jnp.stack([c.astype(jnp.int32) for c in columns], axis=1), rows.out_BxC], axis=1)


def _dispatch_into(ctx, answer_out, server_id, packed_Bx6pC) -> None:
    """`_dispatch` as a `buffer_callback`: reads the request and writes the answer in place, on host buffers."""
    del ctx
    np.asarray(answer_out)[...] = _dispatch(np.asarray(server_id), np.asarray(packed_Bx6pC))


def _host_call(how: str, server_id, request_Bx6pC: jax.Array, answer: jax.ShapeDtypeStruct) -> jax.Array:
    """Run `_dispatch` on the host from inside the loop (`LoopSpec.host_callback`). A `buffer_callback` hands
    the callback the raw host buffers; `io_callback` first copies its operands into new device arrays and its
    result back, which costs most of a call here (profiled on the tiny bench's batch of 16: 98 calls per batch
    at ~0.9 ms each, 0.16 ms of it the read logic). `buffer_callback` exists for CPU and GPU only, so "auto"
    uses `io_callback` on other backends (TPU)."""
    if how == "auto":
        how = "buffer" if jax.default_backend() in ("cpu", "gpu", "cuda", "rocm") else "io"
    if how not in ("buffer", "io"):
        raise ValueError(f"LoopSpec.host_callback={how!r}, expected 'auto', 'buffer' or 'io'")
    if how == "buffer":
        from jax.experimental.buffer_callback import buffer_callback

        return buffer_callback(_dispatch_into, answer, has_side_effect=True)(server_id, request_Bx6pC)
    from jax.experimental import io_callback

    # Unordered: every call's inputs depend on the previous step's outputs, which orders them anyway.
    return io_callback(_dispatch, answer, server_id, request_Bx6pC, ordered=False)


def _call_server(how: str, server_id, rows: _ServedRows) -> tuple:
    """The host callback `server.serve(status_B, out_BxC, n_out_B, lengths_B, budget_B, in_call_B, active_B)`;
    returns (status, cache lengths, forced tokens padded to F, forced count, ban, in_call, active) for every
    row."""
    B, F = rows.forced_BxF.shape
    answer_Bx6pF = _host_call(how, server_id, _pack_request(rows), jax.ShapeDtypeStruct((B, 6 + F), jnp.int32))
    status, lengths, n_forced, ban, in_call, active = (answer_Bx6pF[:, i] for i in range(6))
    return status, lengths, answer_Bx6pF[:, 6:], n_forced, ban != 0, in_call != 0, active != 0


def _unchanged(rows: _ServedRows) -> tuple:
    """What `_call_server` returns, as the fields stand."""
    return (rows.status_B, rows.lengths_B, rows.forced_BxF, rows.forced_len_B, rows.ban_B, rows.in_call_B,
            rows.active_B)


def _serve_reads(spec: LoopSpec, server_id, s: st.DecodeState) -> st.DecodeState:
    """Rows that just closed (`READ_PAUSE`) or reopened (`OPEN_PAUSE`) a call are served by the host
    callback (`_call_server`); only the served rows take its answer. The callback runs only at steps where
    some row needs it, under a `lax.cond` whose operand is the small per-row arrays alone (not the KV
    cache, which the callback never changes)."""
    B = s.status_B.shape[0]
    serve_B = (s.status_B == st.READ_PAUSE) | (s.status_B == st.OPEN_PAUSE)
    rows = _ServedRows(s.status_B, s.n_out_B, s.cache.lengths_B, s.budget_B, s.in_call_B, s.active_call_B,
                       s.out_BxC, s.forced_BxF, s.forced_len_B, s.ban_read_B)
    status_B, lengths_B, forced_BxF, forced_len_B, ban_B, in_call_B, active_B = jax.lax.cond(
        jnp.any(serve_B), functools.partial(_call_server, spec.host_callback, server_id), _unchanged, rows)

    def take(new, old):
        return jnp.where(serve_B.reshape((B,) + (1,) * (old.ndim - 1)), new, old)

    return s.replace(
        cache=s.cache.replace(lengths_B=take(lengths_B, s.cache.lengths_B)),
        status_B=take(status_B, s.status_B),
        forced_BxF=take(forced_BxF, s.forced_BxF),
        forced_pos_B=take(jnp.zeros_like(s.forced_pos_B), s.forced_pos_B),
        forced_len_B=take(forced_len_B, s.forced_len_B),
        ban_read_B=take(ban_B, s.ban_read_B),
        in_call_B=take(in_call_B, s.in_call_B),
        active_call_B=take(active_B, s.active_call_B),
    )


def read_chunk(graphdef, params, s: st.DecodeState, spec: LoopSpec, server: int | None = None,
               longest: int | None = None) -> tuple[st.DecodeState, jax.Array]:
    """Run up to `spec.chunk` steps; exit early once no row is RUNNING (or, with in-loop reads, feeding forced
    tokens). `server`: the id from `register_server`, needed when `spec.answer_width > 0`. `longest`: the
    longest row's cache length, if the caller knows it (else it is fetched from the device, which waits for
    the state). Returns the new state and `state.pack_rows` of it (fetch it once: `state.HostRows.unpack`).
    The given state is donated (its cache is updated in place): it must not be used afterwards.

    A decode step costs about batch x attended slots, so the loop runs on the first `attend` slots of the
    cache only: a power of two that holds every row's length plus the whole chunk (rows cannot get past
    it within the chunk, and later slots are never read)."""
    from memllm_jax.model.mistral import KVCache

    attend = None
    if isinstance(s.cache, KVCache) and not isinstance(s.cache.k_LxBxKxHxS, (tuple, list)):
        if longest is None:
            longest = int(host(s.cache.lengths_B).max(initial=0))
        attend = 2 * MIN_BUCKET
        while attend < longest + spec.chunk:
            attend *= 2
        attend = attend if attend < s.cache.max_len else None
    if spec.answer_width and server is None:
        raise ValueError("read_chunk: in-loop reads (spec.answer_width > 0) need a server id")
    server_id = np.int32(server) if spec.answer_width else None
    return _read_chunk(graphdef, params, s, spec, attend, server_id)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec", "attend"), donate_argnames=("s",))
def _read_chunk(graphdef, params, s: st.DecodeState, spec: LoopSpec, attend: int | None,
                server_id=None) -> tuple[st.DecodeState, jax.Array]:
    model = merge(graphdef, params)
    full = s.cache
    if attend is not None:
        s = s.replace(cache=full.first_slots(attend))

    def cond(carry):
        i, s = carry
        paused = jnp.sum((s.status_B == st.READ_PAUSE) | (s.status_B == st.OPEN_PAUSE) | (s.status_B == st.HOST_FEED))
        busy = s.status_B == st.RUNNING
        if spec.answer_width:
            busy |= s.forced_pos_B < s.forced_len_B
        return (i < spec.chunk) & jnp.any(busy) & (paused < spec.exit_paused)

    def body(carry):
        i, s = carry
        s = _read_step(model, spec, s)
        if spec.answer_width:
            s = _serve_reads(spec, server_id, s)
        return i + 1, s

    s = jax.lax.while_loop(cond, body, (jnp.int32(0), s.replace(cache=_layered(s.cache, model))))[1]
    cache = _stacked(s.cache)
    if attend is not None:
        cache = full.with_first_slots(cache)
    s = s.replace(cache=cache)
    return s, st.pack_rows(s)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _empty_cache(cfg, batch: int, max_len: int):
    from memllm_jax.model.mistral import init_cache

    return init_cache(cfg, batch, max_len)


def cache_factory(model: Any):
    """`make_cache(batch, max_len)` for `model`: its own `make_cache` if it has one, else an empty
    `KVCache` built by one jitted call (three host-side zero arrays cost three dispatches)."""
    if hasattr(model, "make_cache"):
        return model.make_cache
    return functools.partial(_empty_cache, model.cfg)


def vocab_size(model: Any, tokenizer: Any) -> int:
    """Rows of the model's LM head (may exceed the tokenizer's ids)."""
    cfg = getattr(model, "cfg", None)
    return int(cfg.vocab_size) if cfg is not None else int(getattr(model, "vocab_size", tokenizer.vocab_size))


class StaticGraph:
    """A model's `graphdef` as a jit static argument whose hash is computed once.

    jit hashes its static arguments on every call, and hashing an nnx graphdef walks the whole module
    graph (~2 ms for the 2-layer bench model here, i.e. a noticeable share of a one-sentence write)."""

    __slots__ = ("graphdef", "_hash")

    def __init__(self, graphdef: Any):
        self.graphdef, self._hash = graphdef, hash(graphdef)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, StaticGraph) and self._hash == other._hash
                                 and self.graphdef == other.graphdef)


def merge(graphdef: Any, params: Any) -> Any:
    """`nnx.merge` for a graphdef or a `StaticGraph`."""
    return nnx.merge(graphdef.graphdef if isinstance(graphdef, StaticGraph) else graphdef, params)


_INTERNED: list[StaticGraph] = []


def _intern(graphdef: Any) -> StaticGraph:
    static = StaticGraph(graphdef)
    for known in _INTERNED:
        if known == static:
            return known
    _INTERNED[:] = [static] + _INTERNED[:7]
    return static


UNROLL_MAX_BYTES = 1 << 28
"""Largest stacked layer parameters (bytes) that `split_model` copies into an unrolled decoding form."""

_UNROLLED: list[tuple[StaticGraph, tuple, tuple[StaticGraph, Any]]] = []
"""The last unrolled form: (scanned graph, its parameter arrays, the unrolled split)."""


def _unrollable(model: Any, params: Any) -> bool:
    """A scanned `Mistral` whose stacked layers are small and on one device: decoding it unrolled is 1.4-1.8x
    faster per step on CPU (batch 1 and 16, d_model 128, 2 layers, measured), as each scanned step slices
    every layer's cache (or, given per-layer caches, its weights) off the stack. A sharded model stays
    scanned (only one layer's gathered weights live at a time), and so does a large one (the copy of its
    layer weights costs more memory than the per-step slices cost time). Counting the kernels of the copy at their
    bf16 operand size instead made SmolLM2 unrolled and the main job's rows 1 and 2 slower together (194 s + 201 s
    against 203 s + 145 s scanned), so the bound counts the stored weights."""
    from memllm_jax.model.mistral import Mistral

    if not isinstance(model, Mistral) or not model.cfg.scan_layers:
        return False
    layers = jax.tree.leaves(params["layers"])
    one_device = all(len(x.sharding.device_set) == 1 for x in layers if isinstance(x, jax.Array))
    return one_device and sum(x.nbytes for x in layers) <= UNROLL_MAX_BYTES


def _unrolled_split(static: StaticGraph, params: Any) -> tuple[StaticGraph, Any]:
    """The split of an unrolled copy of the scanned model `(static, params)`: its blocks' variables are slices
    of the stack (copied once), everything else is shared. The last one is kept, keyed by the identity of
    the parameter arrays (updated weights are new arrays)."""
    from memllm_jax.model.mistral import unstack_blocks

    arrays = tuple(jax.tree.leaves(params))
    for graph, known, split in _UNROLLED:
        if graph is static and len(known) == len(arrays) and all(a is b for a, b in zip(known, arrays)):
            return split
    copy = merge(static, params)
    copy.layers = nnx.List(unstack_blocks(copy.layers, copy.cfg.n_layers))
    copy.cfg = dataclasses.replace(copy.cfg, scan_layers=False)
    _store_kernels_as_operands(copy.layers)
    graphdef, unrolled = nnx.split(copy)
    split = (_intern(graphdef), unrolled)
    _UNROLLED[:] = [(static, arrays, split)]
    return split


def _store_kernels_as_operands(blocks) -> None:
    """Store the blocks' linear kernels (the copies `_unrolled_split` made) in their matmul operand dtype
    (`ModelConfig.matmul_dtype`) when that is narrower: the products are the same, as the matmul rounds its
    operands to that dtype anyway, and the decoding loop no longer converts every kernel at every step."""
    from memllm_jax.model.mistral import Linear

    for block in blocks:
        for _, module in nnx.iter_modules(block):
            if isinstance(module, Linear):
                operand = jnp.dtype(module.operand_dtype)
                if operand.itemsize < module.kernel[...].dtype.itemsize:
                    module.kernel.set_value(module.kernel[...].astype(operand))


def split_model(model: Any) -> tuple[StaticGraph, Any]:
    """`(graphdef, params)` for the jitted functions. Equal graphdefs give the same `StaticGraph` object
    (the last few are kept), so jit's cache lookups of later calls succeed on identity. A small scanned model
    on one device is split in an unrolled form (`_unrollable`); the decoded tokens are the same."""
    graphdef, params = nnx.split(model)
    static = _intern(graphdef)
    if _unrollable(model, params):
        return _unrolled_split(static, params)
    return static, params


def host(x: Any) -> np.ndarray:
    return np.asarray(jax.device_get(x))
