"""The chunked read-decoding loop: one jitted `while_loop` that samples, pauses at read calls (or serves them
inside the loop through a host callback), and exits to the host. The loop object on the host keeps only
hashable static fields (`LoopSpec`); everything that changes lives in a `DecodeState` pytree.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from memllm_jax.decode import state as st
from memllm_jax.decode.graph import host, layered, merge, stacked
from memllm_jax.decode.sampling import NEG_INF, SamplingConfig, choose
from memllm_jax.decode.shapes import attend_window


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



def run_steps(step: Callable[[Any], Any], more: Callable[[jax.Array, Any], jax.Array], s: Any) -> tuple[Any, jax.Array]:
    """The library's one jitted decoding loop: `s = step(s)` while `more(steps_run, s)`; returns the final state
    and the steps run. The read chunk (`read_chunk`: `_read_step`), the memory-write loop (`step.run_writes`) and greedy
    generation (`eval.scoring.GreedyGenerator`) bring their own step and exit test; nothing leaves the device inside."""
    return jax.lax.while_loop(lambda c: more(c[1], c[0]), lambda c: (step(c[0]), c[1] + 1), (s, jnp.int32(0)))


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
    from memllm_jax.model.decoder import KVCache

    attend = None
    if isinstance(s.cache, KVCache) and not isinstance(s.cache.k_LxBxKxHxS, (tuple, list)):
        if longest is None:
            longest = int(host(s.cache.lengths_B).max(initial=0))
        attend = attend_window(longest, spec.chunk, s.cache.max_len)
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

    def more(i, s):
        paused = jnp.sum((s.status_B == st.READ_PAUSE) | (s.status_B == st.OPEN_PAUSE) | (s.status_B == st.HOST_FEED))
        busy = s.status_B == st.RUNNING
        if spec.answer_width:
            busy |= s.forced_pos_B < s.forced_len_B
        return (i < spec.chunk) & jnp.any(busy) & (paused < spec.exit_paused)

    def step(s):
        s = _read_step(model, spec, s)
        if spec.answer_width:
            s = _serve_reads(spec, server_id, s)
        return s

    s, _ = run_steps(step, more, s.replace(cache=layered(s.cache, model)))
    cache = stacked(s.cache)
    if attend is not None:
        cache = full.with_first_slots(cache)
    s = s.replace(cache=cache)
    return s, st.pack_rows(s)

