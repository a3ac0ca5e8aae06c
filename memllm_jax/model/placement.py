"""Models and caches placed on a device mesh by the logical-axis shardings of `memllm_jax.sharding`.

The model is built abstractly (`nnx.eval_shape`), its shardings are read off the abstract state, and a large
model's real initialisation runs under `jax.jit(..., out_shardings=...)`, so no host ever holds the full
parameter set.
"""

from __future__ import annotations

import functools
import math

import jax
from flax import nnx
from jax.extend.core import ClosedJaxpr, Jaxpr, Var, jaxpr_as_fun
from jax.sharding import Mesh, NamedSharding

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.model.decoder import KVCache, Decoder
from memllm_jax.sharding import check_fits, logical_to_spec, state_shardings


def cache_shardings(cfg: ModelConfig, mesh: Mesh, batch_size: int, max_len: int):
    """A KVCache of NamedShardings: batch over ("data", "fsdp"), kv heads over "tensor"."""
    L, B, K, H = cfg.n_layers, batch_size, cfg.n_kv_heads, cfg.head_dim
    axes = (None, "batch", "kv_heads", None, None)
    k = NamedSharding(mesh, logical_to_spec(axes, (L, B, K, H, max_len), mesh, "KVCache.k_LxBxKxHxS"))
    v = NamedSharding(mesh, logical_to_spec(axes, (L, B, K, max_len, H), mesh, "KVCache.v_LxBxKxSxH"))
    lengths = NamedSharding(mesh, logical_to_spec(("batch",), (batch_size,), mesh, "KVCache.lengths_B"))
    return KVCache(k, v, lengths)


def abstract_model(cfg: ModelConfig, lora_cfg: LoraConfig | None = None, mesh: Mesh | None = None, seed: int = 0):
    """`(graphdef, abstract_state)`; with a mesh the ShapeDtypeStructs carry their target shardings. The state is
    the caller's own (its variables may be set)."""
    if mesh is not None:
        check_fits(cfg, mesh)
    graphdef, state = _traced_model(cfg, lora_cfg, seed)
    if mesh is None:
        state = jax.tree.map(lambda a: a, state)  # new variables holding the same ShapeDtypeStructs
    else:  # new variables too, carrying the shardings
        shardings = state_shardings(state, mesh)
        state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
        )
    return graphdef, state


@functools.lru_cache(maxsize=4)
def _traced_model(cfg: ModelConfig, lora_cfg: LoraConfig | None, seed: int):
    """A `Decoder`'s graphdef and abstract state, traced once per process and configuration: tracing its
    construction takes seconds (1-3 s for SmolLM2-135M, more with adapters: each of the thousands of RNG draws
    costs flax a tracer lookup that grows with the trace), and a pipeline opens models of the same shape several
    times (two adapters on one base, and each adapter's base without it)."""
    return nnx.split(nnx.eval_shape(lambda: Decoder(cfg, lora_cfg, rngs=nnx.Rngs(seed))))


HOST_INIT_MAX_BYTES = 1 << 30
"""Models smaller than this are initialised eagerly on the host (fast numpy initialisers) and then placed
into their shardings; larger ones are initialised under `jax.jit` directly into their shardings."""


def create_model(model_cfg: ModelConfig, lora: LoraConfig | None, mesh, seed: int):
    """A randomly initialised model placed on `mesh` by its logical-axis shardings."""
    if param_bytes(model_cfg, lora, mesh)[0] > HOST_INIT_MAX_BYTES:
        return create_sharded_model(model_cfg, lora, mesh, seed)
    model = Decoder(model_cfg, lora, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, state_shardings(state, mesh))
    return nnx.merge(graphdef, state)


def create_sharded_model(cfg: ModelConfig, lora_cfg: LoraConfig | None, mesh: Mesh, seed: int = 0):
    """Initialise a `Decoder` directly into its shardings on `mesh`."""
    check_fits(cfg, mesh)
    graphdef, abstract = abstract_model(cfg, lora_cfg, None, seed)
    shardings = state_shardings(abstract, mesh)

    def init():
        return nnx.state(Decoder(cfg, lora_cfg, rngs=nnx.Rngs(seed)))

    state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def param_bytes(cfg: ModelConfig, lora_cfg: LoraConfig | None, mesh: Mesh) -> tuple[int, int]:
    """(total parameter bytes, bytes on the most loaded device), from abstract shapes only."""
    graphdef, state = abstract_model(cfg, lora_cfg, None)
    params = nnx.state(nnx.merge(graphdef, state), nnx.Param)
    shardings = state_shardings(params, mesh)
    total = per_device = 0
    for var, sharding in zip(jax.tree.leaves(params), jax.tree.leaves(shardings)):
        nbytes = math.prod(var.shape) * var.dtype.itemsize
        total += nbytes
        shard = sharding.shard_shape(var.shape)
        per_device += math.prod(shard) * var.dtype.itemsize
    return total, per_device


def materialize(graphdef, state, seed: int = 0):
    """Merge `graphdef` with `state`, initialising every leaf that is still a `jax.ShapeDtypeStruct` (LoRA
    adapters, dropout RNG state, ...) fresh, into the sharding the struct carries: inside one jit where they
    spread over several devices, else op by op (`eval_needed`: the same draws)."""
    flat = nnx.to_flat_state(state)
    todo = [(path, var) for path, var in flat if isinstance(var.get_value(), jax.ShapeDtypeStruct)]
    if todo:
        model = nnx.merge(graphdef, state)
        cfg, lora_cfg = model.cfg, model.lora_cfg
        paths = [path for path, _ in todo]
        out_shardings = [var.get_value().sharding for _, var in todo]

        def init():
            fresh = dict(nnx.to_flat_state(nnx.state(Decoder(cfg, lora_cfg, rngs=nnx.Rngs(seed)))))
            return [fresh[p].get_value() for p in paths]

        if all(len(s.device_set) == 1 for s in out_shardings):
            values = jax.device_put(eval_needed(init), out_shardings)
        else:
            values = jax.jit(init, out_shardings=out_shardings)()
        for (_, var), value in zip(todo, values):
            var.set_value(value)
    return nnx.merge(graphdef, state)


def eval_needed(fn):
    """`fn()` (no arguments) evaluated op by op, running only the operations its outputs need. Why: a pretrained
    model's fresh adapters are drawn by the whole model's initialiser under tracing (`init`: `jax.random`), and
    jit compiles all of their draws as one XLA program (15.8-17.8 s for SmolLM2-135M's 420 adapter leaves on a
    2-core CPU), while op by op each distinct draw compiles once (0.7 s). The draws are jit's; XLA may fold a
    program's constant factors in another order, so a value can differ in its last bit (seen for some base
    kernels of a scanned model, never for adapters: the main job's initial training state is bitwise the same)."""
    closed = jax.make_jaxpr(fn)()
    jaxpr = closed.jaxpr
    needed = {v for v in jaxpr.outvars if isinstance(v, Var)}
    eqns = []
    for eqn in reversed(jaxpr.eqns):  # the model's own draws are traced too: dropped, as jit's compiler would
        if eqn.effects or any(v in needed for v in eqn.outvars):
            eqns.append(eqn)
            needed.update(v for v in eqn.invars if isinstance(v, Var))
    pruned = Jaxpr(jaxpr.constvars, jaxpr.invars, jaxpr.outvars, eqns[::-1], jaxpr.effects, jaxpr.debug_info)
    return jaxpr_as_fun(ClosedJaxpr(pruned, closed.consts))()
