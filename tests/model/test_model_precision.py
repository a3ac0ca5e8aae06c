"""Low-precision matmul operands (`ModelConfig.matmul_dtype`) and the hashed dropout mask of LoRA adapters."""

import dataclasses
import re

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.model.dropout import HashDropout, hash_uniform_bits
from memllm_jax.model.matmul import fast_operand_dtype, matmul, mixed_matmul
from memllm_jax.model.decoder import Decoder

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=None, max_seq_len=32, tie_embeddings=True)


def _rounded64(a):
    return np.asarray(jnp.asarray(a, jnp.bfloat16).astype(jnp.float32), np.float64)


@pytest.mark.parametrize("transposed", [False, True])
def test_mixed_matmul_is_the_exact_product_of_rounded_operands_with_float32_gradients(transposed):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((24, 40)), jnp.float32)
    w_IxO = jnp.asarray(rng.standard_normal((40, 16)), jnp.float32)
    w = w_IxO.T.copy() if transposed else w_IxO  # an output-major weight (the tied head's embedding) when transposed
    dy = jnp.asarray(rng.standard_normal((24, 16)), jnp.float32)
    y, vjp = jax.vjp(lambda x, w: mixed_matmul(x, w, "bfloat16", transposed), x, w)
    assert y.dtype == jnp.float32
    np.testing.assert_allclose(y, _rounded64(x) @ _rounded64(w_IxO), rtol=1e-5, atol=1e-5)
    dx, dw = vjp(dy)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype and dw.shape == w.shape
    np.testing.assert_allclose(dx, _rounded64(dy) @ _rounded64(w_IxO).T, rtol=1e-5, atol=1e-5)
    dw_IxO = dw.T if transposed else dw
    np.testing.assert_allclose(dw_IxO, _rounded64(x).T @ _rounded64(dy), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(matmul(x, w, "float32", transposed=transposed), x @ w_IxO)
    # Not the float32 product: the operands really are rounded.
    assert np.abs(np.asarray(y, np.float64) - np.asarray(x, np.float64) @ np.asarray(w_IxO, np.float64)).max() > 1e-4


def test_every_matmul_of_the_backward_pass_takes_low_precision_operands():
    """Autodiff of a bf16 x bf16 -> f32 dot multiplies the f32 cotangent with a bf16 operand, which XLA runs
    as a float32 matmul; the custom VJP rounds the cotangent first."""
    x = jnp.ones((16, 8), jnp.float32)
    w = jnp.ones((8, 4), jnp.float32)
    loss = lambda x, w: jnp.sum(matmul(x, w, "bfloat16") ** 2)  # noqa: E731
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, w)

    def dots(jaxpr):
        yield from (eqn for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general")
        for sub in jax.extend.core.subjaxprs(jaxpr):
            yield from dots(sub)

    found = list(dots(jaxpr.jaxpr))
    assert len(found) >= 3  # forward, input gradient, weight gradient
    for eqn in found:
        assert [v.aval.dtype for v in eqn.invars] == [jnp.bfloat16, jnp.bfloat16], eqn


def test_float32_operands_take_the_plain_matmul():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((5, 6)), jnp.float32)
    w = jnp.asarray(np.random.default_rng(2).standard_normal((6, 3)), jnp.float32)
    np.testing.assert_array_equal(matmul(x, w, "float32"), x @ w)
    np.testing.assert_array_equal(matmul(x, w, None), x @ w)


def _compiled_dot_operands(hlo_text: str) -> list[tuple[str, str, bool]]:
    """`(lhs dtype, rhs dtype, batched)` of every dot in a compiled XLA program's text."""
    found = []
    for block in re.split(r"\n(?=\S)", hlo_text):
        dtypes = dict(re.findall(r"%([\w.-]+) = (\w+)\[", block))
        for lhs, rhs, attrs in re.findall(r"= \w+\[[0-9,]*\]\S* dot\(%([\w.-]+), %([\w.-]+)\)([^\n]*)", block):
            found.append((dtypes[lhs], dtypes[rhs], "lhs_batch_dims" in attrs))
    return found


@pytest.mark.slow
def test_compiled_lora_gradient_multiplies_every_linear_adapter_and_the_tied_head_in_bf16():
    """What XLA runs, not only what JAX traces: the tied head's `[vocab, d_model]` embedding used as `E.T` was
    converted and multiplied in float32 after compilation, and the adapters' factors were float32 operands.
    Only attention's batched dots stay float32."""
    cfg = dataclasses.replace(CFG, matmul_dtype="bfloat16")
    model = Decoder(cfg, LoraConfig(rank=4, alpha=8.0, dropout=0.0), rngs=nnx.Rngs(0))
    graphdef, adapter, frozen = nnx.split(model, nnx.LoRAParam, ...)
    tokens = jnp.zeros((2, 12), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(12), (2, 12))

    def loss(adapter, frozen):
        return nnx.merge(graphdef, adapter, frozen)(tokens, positions)[0].sum()

    dots = _compiled_dot_operands(jax.jit(jax.grad(loss)).lower(adapter, frozen).compile().as_text())
    unbatched = [d for d in dots if not d[2]]
    assert len(unbatched) >= 2 * 7 * cfg.n_layers  # every linear layer's and adapter's products
    assert all(d[:2] == ("bf16", "bf16") for d in unbatched), sorted(set(dots))
    assert {d[:2] for d in dots if d[2]} == {("f32", "f32")}  # attention


def _logits_and_grad(cfg, lora):
    model = Decoder(cfg, lora, rngs=nnx.Rngs(0))
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 128, (2, 12)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(12), (2, 12))

    def loss(model):
        logits, _ = model(tokens, pos)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, jnp.roll(tokens, -1, 1)[..., None], -1)[..., 0]), logits

    (value, logits), grads = nnx.value_and_grad(loss, has_aux=True, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
    return logits, value, grads


@pytest.mark.slow
def test_bfloat16_matmuls_in_the_model_track_float32_and_train_the_adapters():
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0)
    logits32, loss32, grads32 = _logits_and_grad(CFG, lora)
    logits16, loss16, grads16 = _logits_and_grad(dataclasses.replace(CFG, matmul_dtype="bfloat16"), lora)
    assert logits16.dtype == jnp.float32
    scale = float(jnp.abs(logits32).max())
    assert 0 < float(jnp.abs(logits16 - logits32).max()) < 0.02 * scale
    assert abs(float(loss16) - float(loss32)) < 0.01 * abs(float(loss32))
    g32, g16 = jax.tree.leaves(grads32), jax.tree.leaves(grads16)
    assert len(g32) == len(g16) > 0
    for a, b in zip(g32, g16):
        assert b.dtype == a.dtype
        np.testing.assert_allclose(b, a, atol=0.05 * float(jnp.abs(a).max()) + 1e-6)


def test_hash_dropout_keeps_one_minus_rate_scaled_and_draws_a_fresh_mask_per_call():
    drop = HashDropout(0.1, rngs=nnx.Rngs(dropout=7))
    x = jnp.ones((512, 1024), jnp.float32)
    a, b = drop(x, deterministic=False), drop(x, deterministic=False)
    keep_a, keep_b = np.asarray(a) != 0, np.asarray(b) != 0
    assert abs(keep_a.mean() - 0.9) < 0.002
    np.testing.assert_allclose(np.asarray(a)[keep_a], 1 / 0.9, rtol=1e-6)
    # Successive masks and neighbouring elements are independent: agreement as for independent draws.
    both = 0.9 * 0.9 + 0.1 * 0.1
    assert abs((keep_a == keep_b).mean() - both) < 0.002
    assert abs((keep_a[:, 1:] == keep_a[:, :-1]).mean() - both) < 0.002
    assert abs((keep_a[1:] == keep_a[:-1]).mean() - both) < 0.002
    np.testing.assert_array_equal(drop(x, deterministic=True), x)
    # Same seed, same masks.
    again = HashDropout(0.1, rngs=nnx.Rngs(dropout=7))
    np.testing.assert_array_equal(again(x, deterministic=False), a)


def test_hash_bits_are_uniform():
    bits = np.asarray(hash_uniform_bits(jax.random.key(3), (1 << 20,)), np.uint64)
    counts = np.bincount((bits >> 28).astype(np.int64), minlength=16)  # top 4 bits: 16 equal bins
    expected = len(bits) / 16
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 40  # 15 degrees of freedom: p < 1e-3 above ~37.7
    assert abs(float((bits & 1).mean()) - 0.5) < 0.005


def test_hash_dropout_rejects_what_it_does_not_implement():
    with pytest.raises(ValueError, match="broadcast_dims"):
        HashDropout(0.1, broadcast_dims=(0,), rngs=nnx.Rngs(dropout=0))(jnp.ones((4, 4)), deterministic=False)


def test_fast_operand_dtype_is_bf16_on_accelerators_and_cpus_with_bf16_dots_only():
    amx = "processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni amx_bf16 amx_tile amx_int8\n"
    avx512_bf16 = "processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni avx512_bf16 avx512bw\n"
    avx512 = "processor\t: 0\nflags\t\t: fpu avx512f avx512_vnni avx512bw\n"
    assert fast_operand_dtype("cpu", amx) == fast_operand_dtype("cpu", avx512_bf16) == "bfloat16"
    assert fast_operand_dtype("cpu", avx512) == "float32"
    assert fast_operand_dtype("cpu", "model name\t: amx_bf16 in a name, not a flag\n") == "float32"
    assert fast_operand_dtype("tpu", avx512) == fast_operand_dtype("gpu", "") == "bfloat16"
