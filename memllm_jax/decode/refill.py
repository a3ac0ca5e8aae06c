"""Continuous batching ("refill") for memory-write decoding.

`writer.decode_writes` runs a batch until its last row has stopped: a row whose call ended early idles until the
batch's longest call ends. Here a pool of B rows decodes a whole stream of prompts: the jitted loop exits to the
host once `refill_at` rows have stopped while prompts are pending; the host reads the stopped rows' results,
prefills the next prompts in a small cache of their own (`writer.prefill_prompts`, so one document's prompts
still share their pretext) and grafts those rows into the pool's cache and state with one jitted call that
updates the pool's buffers in place (`_graft`); the other rows keep their state and go on decoding. Decoding is
greedy and rows are independent, so each prompt gets the result `decode_writes` gives it.

A grafted row starts from `writer.initial_state` of its new prompt: every per-row field (KV cache row and
length, logits, tokens, log-probs, counts, status, late-stopping scores, item bans) is replaced. A model whose
cache has no batch axis to graft along decodes in consecutive batches as `decode_writes` does.
"""

from __future__ import annotations

import functools
from typing import Iterator, Sequence

import jax
import jax.numpy as jnp

from memllm_jax.decode import state as st
from memllm_jax.decode.graph import cache_factory, layered, merge, split_model, vocab_size
from memllm_jax.decode.shapes import cache_slots
from memllm_jax.decode.step import run_writes
from memllm_jax.decode.writer import (WriteDecoding, WriteSpec, decode_writes, host_rows, initial_state,
                                      prefill_prompts, row_results, write_spec)

REFILL_FRACTION = 0.25
"""Default `refill_at` as a fraction of the pool (`default_refill_at`). Refilling at every stop costs a loop exit
(host round trip, prefill and graft dispatches) per stopped row and prefills of one or two rows, which share no
pretext; waiting longer leaves stopped rows idle. Counted with `bench.roofline` (SmolLM2 shape, pools of 16 and
32 on `memllm bench decode`'s write corpora of 4 x pool sentences, call lengths of a random decoder, quartiles
4 / 4 / 18 / 48 steps): useful / executed FLOPs varied by only a few points from refill_at 1 to pool / 2 (decode
halved against fixed batches, prefill up 10-30% as small fills lose sharing), while loop exits fell from 20-33
at 1 to 9-16 at a quarter of the pool; no threshold was timed on an idle host."""


def default_refill_at(pool: int) -> int:
    return max(1, round(pool * REFILL_FRACTION))


def fill_sizes(k: int) -> list[int]:
    """The prefills that bring `k` new prompts into the pool: a power of two rows each, largest first (few compiled
    shapes, and no padding rows: a padding row costs a whole prompt's prefill)."""
    return [1 << i for i in reversed(range(k.bit_length())) if k >> i & 1]


def exit_at(pool: int, running: int, pending: int, refill_at: int) -> int:
    """The loop's exit threshold, in rows not running, when `running` rows run and `pending` prompts wait: once
    `min(refill_at, pending)` more rows have stopped; with nothing pending never (it runs until all have)."""
    return pool - running + min(refill_at, pending) if pending else pool + 1


def row_axes(graphdef, params, make_cache, rows: int, max_len: int) -> tuple[int, ...] | None:
    """Per leaf of the loop's cache (the form `write_loop` carries, `graph.layered`), the axis along which its
    rows lie: the one axis whose size follows the row count. None when a leaf has no such axis."""
    def shapes(n):
        return jax.eval_shape(lambda p: layered(make_cache(n, max_len), merge(graphdef, p)), params)

    (one, tree), (more, tree_more) = (jax.tree.flatten(shapes(n)) for n in (rows, rows + 1))
    if tree != tree_more:
        return None
    axes = []
    for a, b in zip(one, more):
        diff = [i for i, (m, n) in enumerate(zip(a.shape, b.shape)) if m != n]
        if len(a.shape) != len(b.shape) or len(diff) != 1 or (a.shape[diff[0]], b.shape[diff[0]]) != (rows, rows + 1):
            return None
        axes.append(diff[0])
    return tuple(axes)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def _empty_pool(graphdef, params, cache, logits_BxV, spec: WriteSpec) -> st.WriteState:
    """A pool whose rows are all free (IDLE), its cache in the loop's form."""
    s = initial_state(cache, logits_BxV, 0, spec)
    return s.replace(cache=layered(cache, merge(graphdef, params)))


def _put_rows(axis: int, rows_K: jax.Array, old, new):
    """`old` with its rows `rows_K` (along `axis`) replaced by `new`'s."""
    return old.at[(slice(None),) * axis + (rows_K,)].set(new, unique_indices=True)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec", "axes"), donate_argnames=("pool",))
def _graft(graphdef, params, pool: st.WriteState, cache, logits_KxV, rows_K, spec: WriteSpec,
           axes: tuple[int, ...]) -> st.WriteState:
    """Pool rows `rows_K[i]` take row i of the freshly prefilled `cache` / `logits_KxV` and its `initial_state`.
    `pool` is donated: its buffers are updated in place."""
    fresh = initial_state(layered(cache, merge(graphdef, params)), logits_KxV, logits_KxV.shape[0], spec)
    old, tree = jax.tree.flatten(pool.cache)
    cache = jax.tree.unflatten(tree, [_put_rows(a, rows_K, o, n)
                                      for a, o, n in zip(axes, old, jax.tree.leaves(fresh.cache))])
    rest = jax.tree.map(functools.partial(_put_rows, 0, rows_K), pool.replace(cache=None), fresh.replace(cache=None))
    return rest.replace(cache=cache)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"), donate_argnames=("s",))
def _run(graphdef, params, s: st.WriteState, exit_at_rows, spec: WriteSpec) -> tuple[st.WriteState, jax.Array]:
    """`step.run_writes` on the pool until at least `exit_at_rows` rows are not running (or none runs); the cache
    stays in the loop's form between calls. Also returns the steps run."""
    return run_writes(merge(graphdef, params), spec, s, exit_at_rows)


def iter_refill_writes(model, tokenizer, prompt_ids: Sequence[Sequence[int]],
                       decoding: WriteDecoding = WriteDecoding(), *, pool: int = 16, refill_at: int | None = None,
                       make_cache=None, share_prefixes: bool = True, split=None,
                       trace: list | None = None) -> Iterator[list[tuple[int, dict]]]:
    """Decode the write call after every prompt in a pool of `pool` rows, refilled as rows stop. Yields after each
    loop exit the (prompt index, result) pairs of the calls that ended, in any order; results are those of
    `decode_writes` (same `decoding`). `refill_at`: rows that must have stopped before the loop exits to refill
    them (default `default_refill_at`). `trace`: a list that gets, per loop call, the prompt indices filled
    before it and the steps it ran (`bench.roofline.refill_schedule` predicts it)."""
    prompts = [list(p) for p in prompt_ids]
    if not prompts:
        return
    graphdef, params = split_model(model) if split is None else split
    make_cache = cache_factory(model) if make_cache is None else make_cache
    max_len = cache_slots(max(map(len, prompts)), decoding.max_new_tokens)
    spec = write_spec(tokenizer, decoding, max_len)
    axes = row_axes(graphdef, params, make_cache, pool, max_len)
    if axes is None:  # nothing to graft along: today's consecutive batches
        for start in range(0, len(prompts), pool):
            outs = decode_writes(model, tokenizer, prompts[start:start + pool], decoding, pad_to=pool,
                                 make_cache=make_cache, share_prefixes=share_prefixes, split=(graphdef, params))
            yield list(enumerate(outs, start))
        return
    refill_at = default_refill_at(pool) if refill_at is None else max(1, refill_at)
    vocab = vocab_size(model, tokenizer)
    fill = functools.partial(_fill, graphdef, params, make_cache, vocab, spec, axes, share_prefixes)
    s = _empty_pool(graphdef, params, make_cache(pool, max_len), jnp.zeros((pool, vocab)), spec)
    held = [-1] * pool  # the prompt each row decodes (-1: free)
    pending = 0  # the next prompt to fill
    while True:
        free = [b for b in range(pool) if held[b] < 0]
        new = list(range(pending, min(len(prompts), pending + len(free))))
        s = fill(s, free, [prompts[i] for i in new])
        for b, i in zip(free, new):
            held[b] = i
        pending += len(new)
        running = sum(h >= 0 for h in held)
        if not running:
            return
        s, steps = _run(graphdef, params, s, jnp.int32(exit_at(pool, running, len(prompts) - pending, refill_at)),
                        spec)
        fields = host_rows(s)
        status_B = fields[-1]
        stopped = [b for b in range(pool) if held[b] >= 0 and status_B[b] != st.RUNNING]
        if trace is not None:
            trace.append((new, int(steps)))
        yield list(zip([held[b] for b in stopped], row_results(tokenizer, spec, fields, stopped)))
        for b in stopped:
            held[b] = -1


def _fill(graphdef, params, make_cache, vocab: int, spec: WriteSpec, axes: tuple[int, ...], share_prefixes: bool,
          s: st.WriteState, free: list[int], prompts: list[list[int]]) -> st.WriteState:
    """Prefill `prompts` (in `fill_sizes` pieces) and graft them into the pool's free rows `free`."""
    start = 0
    for K in fill_sizes(len(prompts)):
        cache, logits = prefill_prompts(graphdef, params, make_cache, spec.max_len, vocab, prompts[start:start + K],
                                        K, share_prefixes)
        s = _graft(graphdef, params, s, cache, logits, jnp.asarray(free[start:start + K], jnp.int32), spec=spec,
                   axes=axes)
        start += K
    return s


def refill_writes(model, tokenizer, prompt_ids: Sequence[Sequence[int]], decoding: WriteDecoding = WriteDecoding(), *,
                  pool: int = 16, **kwargs) -> list[dict]:
    """`iter_refill_writes`' results in prompt order: what `decode_writes` gives each prompt, decoded in a pool of
    `pool` rows refilled with the next prompts as its rows stop."""
    outs: dict[int, dict] = {}
    for done in iter_refill_writes(model, tokenizer, prompt_ids, decoding, pool=pool, **kwargs):
        outs.update(done)
    return [outs[i] for i in range(len(outs))]
