"""Sampling filters against their numpy definitions; explicit RNG makes sampling reproducible."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memllm_jax.decode.sampling import SamplingConfig, argmax, choose, filter_logits


def reference_keep(logits, top_k, top_p):
    order = np.argsort(-logits, kind="stable")
    keep = np.zeros_like(logits, bool)
    keep[order[: top_k or len(logits)]] = True
    masked = np.where(keep, logits, -np.inf)
    probs = np.exp(masked - masked.max())
    probs /= probs.sum()
    kept, mass = set(), 0.0
    for t in np.argsort(-masked, kind="stable"):
        if mass >= top_p or not keep[t]:
            break
        kept.add(int(t))
        mass += probs[t]
    return kept


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (3, 1.0), (0, 0.5), (5, 0.8), (1, 0.3)])
def test_filters_match_definition(top_k, top_p):
    logits = np.random.default_rng(top_k).normal(size=(4, 20)).astype(np.float32) * 2
    out = np.asarray(filter_logits(jnp.asarray(logits), SamplingConfig(1.0, top_k, top_p)))
    for b in range(4):
        assert set(np.nonzero(out[b] > -1e29)[0].tolist()) == reference_keep(logits[b], top_k, top_p)


@pytest.mark.slow
def test_sampling_is_reproducible_and_follows_the_distribution():
    logits = jnp.log(jnp.asarray([[0.7, 0.2, 0.1, 0.0]] * 4000) + 1e-12)
    cfg = SamplingConfig(temperature=1.0)
    a = np.asarray(choose(logits, jax.random.PRNGKey(1), cfg))
    b = np.asarray(choose(logits, jax.random.PRNGKey(1), cfg))
    assert (a == b).all()
    freq = np.bincount(a, minlength=4) / len(a)
    np.testing.assert_allclose(freq, [0.7, 0.2, 0.1, 0.0], atol=0.03)
    top1 = np.asarray(choose(logits, jax.random.PRNGKey(2), SamplingConfig(temperature=1.0, top_k=1)))
    assert (top1 == 0).all() and (np.asarray(choose(logits, None, SamplingConfig())) == 0).all()


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(16, 256), (3, 5, 7), (1, 1)])
def test_argmax_is_jnp_argmax(shape):
    """Ties (the first maximum), NaN (the first NaN, which XLA's CPU max may skip), all -inf, every axis."""
    rng = np.random.default_rng(len(shape))
    for case in ("normal", "ties", "nan", "-inf"):
        x = rng.normal(size=shape).astype(np.float32)
        if case == "ties":
            x = np.round(x)
        elif case == "nan":
            x[..., rng.integers(shape[-1])] = np.nan
            x.reshape(-1)[:: 3] = np.nan
        elif case == "-inf":
            x[:] = -np.inf
        for axis in range(-len(shape), len(shape)):
            got = jax.jit(argmax, static_argnums=1)(jnp.asarray(x), axis)
            assert got.dtype == jnp.int32
            np.testing.assert_array_equal(np.asarray(got), np.asarray(jnp.argmax(jnp.asarray(x), axis=axis)),
                                          err_msg=f"{case}, axis {axis}")
    ints = jnp.asarray(rng.integers(0, 4, (6, 9)).astype(np.int32))
    np.testing.assert_array_equal(np.asarray(argmax(ints)), np.asarray(jnp.argmax(ints, axis=-1)))
