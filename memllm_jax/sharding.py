"""Device mesh, the logical-axis rule table, and sharded model creation.

Every parameter carries `logical_axes` metadata (e.g. `("embed", "q_heads", "head_dim")`); one short table
maps logical names to mesh axes. The model is built abstractly (`nnx.eval_shape`), its shardings are read
off the abstract state, and the real initialisation runs under `jax.jit(..., out_shardings=...)`, so no host
ever holds the full parameter set.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from memllm_jax.config import LoraConfig, MeshConfig, ModelConfig

AXES = ("data", "fsdp", "tensor")

LOGICAL_AXIS_RULES: dict[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),  # activations: batch over both data-parallel axes
    "embed": "fsdp",  # parameters: d_model rows sharded ZeRO-3 style
    "vocab": "tensor",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    # "layers" (scanned parameters' leading axis), "seq", "embed_act", "head_dim", "norm", "lora_rank": replicated
}
"""Logical axis -> mesh axis (or axes); names not listed are replicated."""

_STRICT = {"q_heads": "ModelConfig.n_heads", "kv_heads": "ModelConfig.n_kv_heads"}


def make_mesh(cfg: MeshConfig = MeshConfig(), devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A `("data", "fsdp", "tensor")` mesh; one size may be -1 (all remaining devices)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = [cfg.data, cfg.fsdp, cfg.tensor]
    if sum(s == -1 for s in sizes) > 1 or any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"MeshConfig {sizes}: sizes must be positive, at most one may be -1")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if len(devices) % known:
            raise ValueError(f"MeshConfig {sizes}: {len(devices)} devices are not divisible by {known}")
        sizes[sizes.index(-1)] = len(devices) // known
    if math.prod(sizes) != len(devices):
        raise ValueError(f"MeshConfig data*fsdp*tensor = {math.prod(sizes)} but there are {len(devices)} devices")
    return Mesh(np.asarray(devices).reshape(sizes), AXES)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int], mesh: Mesh, where: str = "") -> PartitionSpec:
    """Map logical axis names to a PartitionSpec. Heads that do not divide the tensor axis are an error;
    other dimensions that do not divide their mesh axes are replicated."""
    spec: list[Any] = []
    used: set[str] = set()
    for name, dim in zip(logical, shape):
        target = LOGICAL_AXIS_RULES.get(name) if name else None
        axes = (target,) if isinstance(target, str) else tuple(target or ())
        axes = tuple(a for a in axes if a in mesh.shape and mesh.shape[a] > 1 and a not in used)
        size = math.prod(mesh.shape[a] for a in axes)
        if axes and dim % size:
            if name in _STRICT:
                raise ValueError(
                    f"{_STRICT[name]}={dim} is not divisible by the mesh axis {'x'.join(axes)}={size}"
                    + (f" (parameter {where})" if where else "")
                )
            axes = ()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else axes)
    return PartitionSpec(*spec)


def check_fits(cfg: ModelConfig, mesh: Mesh) -> None:
    """Raise a ValueError naming the field when the heads do not divide the tensor axis."""
    tensor = mesh.shape.get("tensor", 1)
    for field in ("n_heads", "n_kv_heads"):
        value = getattr(cfg, field)
        if value % tensor:
            raise ValueError(f"ModelConfig.{field}={value} is not divisible by the mesh axis tensor={tensor}")


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading (batch) axis over ("data", "fsdp"), the rest replicated."""
    return NamedSharding(mesh, PartitionSpec(("data", "fsdp"), *([None] * (ndim - 1))))


def cache_shardings(cfg: ModelConfig, mesh: Mesh, batch_size: int, max_len: int):
    """A KVCache of NamedShardings: batch over ("data", "fsdp"), kv heads over "tensor"."""
    from memllm_jax.model.mistral import KVCache

    shape = (cfg.n_layers, batch_size, max_len, cfg.n_kv_heads, cfg.head_dim)
    kv = NamedSharding(mesh, logical_to_spec((None, "batch", None, "kv_heads", None), shape, mesh, "KVCache"))
    lengths = NamedSharding(mesh, logical_to_spec(("batch",), (batch_size,), mesh, "KVCache.lengths_B"))
    return KVCache(kv, kv, lengths)


def row_sharding(sharding, depth: int = 1):
    """The sharding of one row of an array stacked on `depth` leading unsharded axes (a scanned layer's
    parameter, a cache layer), and back with `depth=-1` (the stack of rows sharded like `sharding`)."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = tuple(sharding.spec)[depth:] if depth > 0 else (None,) * -depth + tuple(sharding.spec)
    return NamedSharding(sharding.mesh, PartitionSpec(*spec))


def constrain(x: jax.Array, logical: Sequence[str | None]) -> jax.Array:
    """`with_sharding_constraint` by logical names when a mesh is set (`jax.set_mesh`); a no-op otherwise."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return x
    return jax.lax.with_sharding_constraint(x, logical_to_spec(logical, x.shape, mesh))


def _path_str(path) -> str:
    return ".".join(str(getattr(p, "key", p)) for p in path)


def state_shardings(abstract_state, mesh: Mesh):
    """NamedShardings for an (abstract) nnx.State from each variable's `logical_axes` metadata."""
    from flax import nnx

    def one(path, var):
        if not isinstance(var, nnx.Variable):
            return NamedSharding(mesh, PartitionSpec())
        logical = var.get_metadata().get("logical_axes")
        value = var.get_value()
        if logical is None or not hasattr(value, "shape"):
            return var.replace(NamedSharding(mesh, PartitionSpec()))
        return var.replace(NamedSharding(mesh, logical_to_spec(logical, value.shape, mesh, _path_str(path))))

    return jax.tree_util.tree_map_with_path(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def abstract_model(cfg: ModelConfig, lora_cfg: LoraConfig | None = None, mesh: Mesh | None = None, seed: int = 0):
    """`(graphdef, abstract_state)`; with a mesh the ShapeDtypeStructs carry their target shardings."""
    from flax import nnx

    from memllm_jax.model.mistral import Mistral

    if mesh is not None:
        check_fits(cfg, mesh)
    abstract = nnx.eval_shape(lambda: Mistral(cfg, lora_cfg, rngs=nnx.Rngs(seed)))
    graphdef, state = nnx.split(abstract)
    if mesh is not None:
        shardings = state_shardings(state, mesh)
        state = jax.tree.map(
            lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), state, shardings
        )
    return graphdef, state


HOST_INIT_MAX_BYTES = 1 << 30
"""Models smaller than this are initialised eagerly on the host (fast numpy initialisers) and then placed
into their shardings; larger ones are initialised under `jax.jit` directly into their shardings."""


def create_model(model_cfg: ModelConfig, lora: LoraConfig | None, mesh, seed: int):
    """A randomly initialised model placed on `mesh` by its logical-axis shardings."""
    from flax import nnx

    from memllm_jax.model.mistral import Mistral

    if param_bytes(model_cfg, lora, mesh)[0] > HOST_INIT_MAX_BYTES:
        return create_sharded_model(model_cfg, lora, mesh, seed)
    model = Mistral(model_cfg, lora, rngs=nnx.Rngs(seed))
    graphdef, state = nnx.split(model)
    state = jax.device_put(state, state_shardings(state, mesh))
    return nnx.merge(graphdef, state)


def create_sharded_model(cfg: ModelConfig, lora_cfg: LoraConfig | None, mesh: Mesh, seed: int = 0):
    """Initialise a Mistral directly into its shardings on `mesh`."""
    from flax import nnx

    from memllm_jax.model.mistral import Mistral

    check_fits(cfg, mesh)
    graphdef, abstract = abstract_model(cfg, lora_cfg, None, seed)
    shardings = state_shardings(abstract, mesh)

    def init():
        return nnx.state(Mistral(cfg, lora_cfg, rngs=nnx.Rngs(seed)))

    state = jax.jit(init, out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def param_bytes(cfg: ModelConfig, lora_cfg: LoraConfig | None, mesh: Mesh) -> tuple[int, int]:
    """(total parameter bytes, bytes on the most loaded device), from abstract shapes only."""
    from flax import nnx

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
    adapters, dropout RNG state, ...) fresh inside one jit, into the sharding the struct carries."""
    from flax import nnx

    from memllm_jax.model.mistral import Mistral

    flat = nnx.to_flat_state(state)
    todo = [(path, var) for path, var in flat if isinstance(var.get_value(), jax.ShapeDtypeStruct)]
    if todo:
        model = nnx.merge(graphdef, state)
        cfg, lora_cfg = model.cfg, model.lora_cfg
        paths = [path for path, _ in todo]
        out_shardings = [var.get_value().sharding for _, var in todo]

        def init():
            fresh = dict(nnx.to_flat_state(nnx.state(Mistral(cfg, lora_cfg, rngs=nnx.Rngs(seed)))))
            return [fresh[p].get_value() for p in paths]

        values = jax.jit(init, out_shardings=out_shardings)()
        for (_, var), value in zip(todo, values):
            var.set_value(value)
    return nnx.merge(graphdef, state)
