"""Device mesh and the logical-axis rule table.

Every parameter carries `logical_axes` metadata (e.g. `("embed", "q_heads", "head_dim")`); one short table
maps logical names to mesh axes (`logical_to_spec`), and `state_shardings` reads a model state's shardings off
that metadata. Models and caches are placed on a mesh by `model.placement`.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from memllm_jax.config import MeshConfig, ModelConfig

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
