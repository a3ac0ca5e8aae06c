"""Parameter initialisers that are fast both eagerly and under tracing.

XLA compiles threefry random-bit generation slowly on CPU (seconds per distinct parameter shape), which made
eager model construction take tens of seconds. With a concrete key we therefore draw the values on the host
with numpy (seeded from the key's data); under tracing (`jax.eval_shape`, the sharded `jax.jit` init) we use
`jax.random`, so a 7B model is still never materialised on one host. The two paths give different (equally
distributed) values for the same seed; each path is deterministic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _host_rng(key: jax.Array) -> np.random.Generator:
    return np.random.default_rng(np.asarray(jax.random.key_data(key)).ravel().tolist())


def normal(key: jax.Array, shape: tuple[int, ...], std: float, dtype) -> jax.Array:
    if isinstance(key, jax.core.Tracer):
        return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    return jnp.asarray((std * _host_rng(key).standard_normal(shape, dtype=np.float32)).astype(dtype))


def uniform(key: jax.Array, shape: tuple[int, ...], bound: float, dtype) -> jax.Array:
    if isinstance(key, jax.core.Tracer):
        return jax.random.uniform(key, shape, jnp.float32, -bound, bound).astype(dtype)
    return jnp.asarray(_host_rng(key).uniform(-bound, bound, shape).astype(np.float32).astype(dtype))
