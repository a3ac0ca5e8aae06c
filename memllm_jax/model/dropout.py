"""Dropout whose mask is a counter hash of the element index, seeded by the dropout stream's key.

`nnx.Dropout` draws its mask with `jax.random.bernoulli`, i.e. threefry over every element: on XLA's CPU
backend ~16 ms for a 4096 x 576 activation (2-core Xeon), and LoRA dropout masks the input of every adapter
(q, k, v, o, gate, up, down: ~9 such masks per layer), which made it 4.2 s of a 14.6-s SmolLM2 training step.
`HashDropout` keeps `nnx.Dropout`'s configuration, state (the stream's counter) and semantics (keep with
probability 1 - rate, scale kept values by 1 / (1 - rate)) and draws only a 64-bit seed from the key; each
element's uniform 32-bit number is then murmur3's finaliser (`fmix32`) applied twice to its flat index mixed
with the seed, ~0.5 ms for the same mask. Its statistics are tested (keep rate, independence of neighbours and
of successive masks); it is not a cryptographic generator, nor meant for anything but dropout masks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax import lax


def fmix32(h: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a bijection of uint32 with full avalanche."""
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hash_uniform_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """uint32 numbers of `shape`, one per element, from `key` (one threefry draw of two words)."""
    size = math.prod(shape)
    if size > 2**32:
        raise ValueError(f"hash_uniform_bits: {size} elements do not fit 32-bit indices")
    seed = jax.random.bits(key, (2,), jnp.uint32)
    index = lax.iota(jnp.uint32, size).reshape(shape)
    return fmix32(fmix32(index ^ seed[0]) + seed[1])


class HashDropout(nnx.Dropout):
    """`nnx.Dropout` (same arguments and state) with the mask of `hash_uniform_bits`."""

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None) -> jax.Array:
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        if self.broadcast_dims or rngs is not None:
            raise ValueError("HashDropout takes no broadcast_dims and no rngs argument")
        keep_prob = 1.0 - self.rate
        threshold = jnp.uint32(min(int(round(self.rate * 2**32)), 2**32 - 1))
        keep = hash_uniform_bits(self.rngs(), inputs.shape) >= threshold
        return lax.select(keep, inputs / jnp.asarray(keep_prob, inputs.dtype), jnp.zeros_like(inputs))
