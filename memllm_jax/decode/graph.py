"""The model as the jitted decoding calls take it, and its cache in the form their loops carry.

The model crosses the jit boundary split into `graphdef` (static, interned as a `StaticGraph` whose hash is
computed once) and `params` (a pytree), and is merged inside the traced function (`merge`). A small scanned
model on one device is split in an unrolled form (`split_model`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _empty_cache(cfg, batch: int, max_len: int):
    from memllm_jax.model.decoder import init_cache

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
    """A scanned `Decoder` whose stacked layers are small and on one device: decoding it unrolled is 1.4-1.8x
    faster per step on CPU (batch 1 and 16, d_model 128, 2 layers, measured), as each scanned step slices
    every layer's cache (or, given per-layer caches, its weights) off the stack. A sharded model stays
    scanned (only one layer's gathered weights live at a time), and so does a large one (the copy of its
    layer weights costs more memory than the per-step slices cost time). Counting the kernels of the copy at their
    bf16 operand size instead made SmolLM2 unrolled and the main job's rows 1 and 2 slower together (194 s + 201 s
    against 203 s + 145 s scanned), so the bound counts the stored weights."""
    from memllm_jax.model.decoder import Decoder

    if not isinstance(model, Decoder) or not model.cfg.scan_layers:
        return False
    layers = jax.tree.leaves(params["layers"])
    one_device = all(len(x.sharding.device_set) == 1 for x in layers if isinstance(x, jax.Array))
    return one_device and sum(x.nbytes for x in layers) <= UNROLL_MAX_BYTES


def _unrolled_split(static: StaticGraph, params: Any) -> tuple[StaticGraph, Any]:
    """The split of an unrolled copy of the scanned model `(static, params)`: its blocks' variables are slices
    of the stack (copied once), everything else is shared. The last one is kept, keyed by the identity of
    the parameter arrays (updated weights are new arrays)."""
    from memllm_jax.model.decoder import unstack_blocks

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
    from memllm_jax.model.decoder import Linear

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
    """`x` fetched to the host as a numpy array."""
    return np.asarray(jax.device_get(x))


def layered(cache: Any, model: Any) -> Any:
    """Per-layer cache buffers for the loop carry of an unrolled model (see `mistral.unstack_cache`). A scanned
    model (`ModelConfig.scan_layers`) scans over the stacked cache, so it stays stacked: slower for the tiny
    CPU models (1.1-2x per token), but only one layer's gathered weights are live at a time (a 7B decode step
    on fsdp 8 would otherwise hold every layer's). `split_model` gives small single-device scanned models to
    the loops unrolled."""
    from memllm_jax.model.decoder import KVCache, unstack_cache

    if not isinstance(cache, KVCache) or getattr(getattr(model, "cfg", None), "scan_layers", False):
        return cache
    return unstack_cache(cache)


def stacked(cache: Any) -> Any:
    from memllm_jax.model.decoder import KVCache, stack_cache

    return stack_cache(cache) if isinstance(cache, KVCache) else cache

