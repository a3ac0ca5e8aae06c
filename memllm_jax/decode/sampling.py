"""Next-token choice: greedy or sampling with temperature, top-k and top-p, with an explicit PRNG key."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -1e30


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen (hashable: a static argument of the jitted loops)."""

    temperature: float = 0.0
    """0 = greedy (argmax); otherwise logits are divided by it before sampling."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = all)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches p (1 = all)."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = SamplingConfig()


def filter_logits(logits_BxV: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """Temperature, then top-k, then top-p; removed tokens get NEG_INF."""
    logits_BxV = logits_BxV / cfg.temperature
    V = logits_BxV.shape[-1]
    if 0 < cfg.top_k < V:
        kth_B = jax.lax.top_k(logits_BxV, cfg.top_k)[0][:, -1]
        logits_BxV = jnp.where(logits_BxV < kth_B[:, None], NEG_INF, logits_BxV)
    if cfg.top_p < 1.0:
        sorted_BxV = jnp.sort(logits_BxV, axis=-1)[:, ::-1]
        probs_BxV = jax.nn.softmax(sorted_BxV, axis=-1)
        # A token is kept while the mass of the strictly more likely tokens is below p.
        before_BxV = jnp.cumsum(probs_BxV, axis=-1) - probs_BxV
        n_keep_B = jnp.maximum(jnp.sum(before_BxV < cfg.top_p, axis=-1), 1)
        cutoff_B = jnp.take_along_axis(sorted_BxV, (n_keep_B - 1)[:, None], axis=-1)[:, 0]
        logits_BxV = jnp.where(logits_BxV < cutoff_B[:, None], NEG_INF, logits_BxV)
    return logits_BxV


def argmax(x: jax.Array, axis: int = -1) -> jax.Array:
    """`jnp.argmax(x, axis)` as int32, the same index (the first maximum; the first NaN if there is one), computed
    as plain reductions: the maximum, then the first index holding it. For one decoding step's logits (rows x
    vocabulary, a few MB): XLA's CPU backend lowers `argmax` to one reduction over (value, index) pairs that does
    not vectorise, 5x slower than this on 16 x 256 and 1.5x on 16 x 49,152. Not for large
    arrays: this reads `x` three times, and from 256 x 49,152 on (whole documents' logits) memory bandwidth makes
    the single pass of `jnp.argmax` 2.4-2.6x faster."""
    axis = axis % x.ndim
    n = x.shape[axis]
    index = jax.lax.broadcasted_iota(jnp.int32, x.shape, axis)

    def first(hit):
        return jnp.min(jnp.where(hit, index, n), axis=axis)

    top = first(x == jnp.max(x, axis=axis, keepdims=True))
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return top
    nan = first(jnp.isnan(x))  # XLA's CPU max may skip NaNs; jnp.argmax returns the first one
    return jnp.where(nan < n, nan, top)


def choose(logits_BxV: jax.Array, rng: jax.Array, cfg: SamplingConfig) -> jax.Array:
    """int32 next tokens of shape B."""
    if cfg.greedy:
        return argmax(logits_BxV)
    return jax.random.categorical(rng, filter_logits(logits_BxV, cfg), axis=-1).astype(jnp.int32)
