"""`ModelConfig.attention`: `jax.nn.dot_product_attention` (the implementation that becomes cuDNN flash attention on
GPUs) gives the reference einsum path's logits and gradients, with packed segments, a sliding window, padding and
a KV cache. The "xla" implementation runs on CPU; "cudnn" needs an NVIDIA GPU and is not exercised here."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.model.decoder import Decoder, init_cache
from memllm_jax.train.loss import masked_cross_entropy

CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=5, max_seq_len=64, scan_layers=True)
LORA = LoraConfig(rank=4, dropout=0.0)


def _models(implementation: str = "einsum", ref_changes: dict | None = None, **changes):
    """The reference model (CFG with `ref_changes`) with random adapters, and the same weights under CFG with the
    attention `implementation` and `changes`."""
    ref = Decoder(dataclasses.replace(CFG, **(ref_changes or {})), LORA, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    for _, var in nnx.to_flat_state(nnx.state(ref, nnx.LoRAParam)):
        var[...] = jnp.asarray(0.2 * rng.standard_normal(var[...].shape), jnp.float32)
    other = Decoder(dataclasses.replace(CFG, attention=implementation, **changes), LORA, rngs=nnx.Rngs(0))
    nnx.update(other, nnx.state(ref))
    return ref, other


def _packed_training(models):
    """Per model: the logits, adapter gradients and jaxpr of a masked loss over 3 rows of two packed segments
    (positions restarting at 0), the last row padded; and the padding mask."""
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (3, 12)), jnp.int32)
    segments = jnp.asarray(np.repeat([[1] * 7 + [2] * 5], 3, axis=0), jnp.int32)
    positions = jnp.asarray(np.concatenate([np.arange(7), np.arange(5)])[None].repeat(3, 0), jnp.int32)
    mask = jnp.ones((3, 12), bool).at[2, 9:].set(False)
    targets = jnp.roll(tokens, -1, axis=1)
    outs = []
    for model in models:
        graphdef, params, rest = nnx.split(model, nnx.LoRAParam, ...)

        @jax.jit
        def loss(params, rest):
            m = nnx.merge(graphdef, params, rest, copy=True)
            logits, _ = m(tokens, positions, mask, segment_ids_BxL=segments)
            total, n = masked_cross_entropy(logits, targets, mask)
            return total / n, logits

        (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params, rest)
        outs.append((logits, nnx.to_pure_dict(grads), jax.make_jaxpr(loss)(params, rest)))
    return outs, mask


def test_unknown_implementation_is_refused():
    with pytest.raises(ValueError, match="ModelConfig.attention='flash'"):
        Decoder(dataclasses.replace(CFG, attention="flash"), rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_dot_product_attention_equals_einsum_in_training():
    ((l0, g0, _), (l1, g1, _)), mask = _packed_training(_models("xla"))
    np.testing.assert_allclose(l0[mask], l1[mask], atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g0, g1)
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g1)) > 0


@pytest.mark.slow
def test_dot_product_attention_equals_einsum_with_a_kv_cache():
    rng = np.random.default_rng(2)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (2, 10)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(10), (2, 10))
    fwd = nnx.jit(lambda m, t, p, mask, cache: m(t, p, mask, cache=cache))
    runs = []
    for model in _models("xla"):
        cache = init_cache(CFG, 2, 16)
        steps = []
        for lo, hi in ((0, 6), (6, 9)):  # a prefill, then a second multi-token chunk on the cache
            logits, cache = fwd(model, tokens[:, lo:hi], positions[:, lo:hi], jnp.ones((2, hi - lo), bool), cache)
            steps.append(logits)
        runs.append(steps)
    for a, b in zip(*runs):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("block", [4, 5])
def test_causal_query_blocks_equal_one_block(block):
    """`ModelConfig.attention_block`: queries in blocks against the keys up to each block's end give the logits and
    gradients of one full block, with packed segments (positions restart at 0), padding, the sliding window and a
    last block shorter than the others (12 tokens in blocks of 5)."""
    ((l0, g0, jaxpr0), (l1, g1, jaxpr1)), mask = _packed_training(
        _models(ref_changes={"attention_block": 0}, attention_block=block))
    np.testing.assert_allclose(l0[mask], l1[mask], atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g0, g1)
    assert str(jaxpr1).count("dot_general") > str(jaxpr0).count("dot_general")  # the blocked path did run
