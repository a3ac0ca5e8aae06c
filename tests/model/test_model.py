"""Decoder parity with HF torch Mistral (eager attention), KV-cache decoding, dtypes, remat."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import ModelConfig
from memllm_jax.model.hf import load_hf
from memllm_jax.model.decoder import KVCache, Decoder, init_cache
from tests.support.hf_models import hf_logits, layer_param, padded_batch, save_hf_mistral

CFG = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128,
                  sliding_window=None, rope_theta=10000.0, max_seq_len=64)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("window", [None, 5])
def test_hf_parity_float32_with_padding(tmp_path, window, scan):
    cfg = dataclasses.replace(CFG, sliding_window=window)
    hf = save_hf_mistral(cfg, tmp_path, seed=1)
    loaded_cfg, model = load_hf(tmp_path, scan_layers=scan)
    assert loaded_cfg.sliding_window == window and loaded_cfg.scan_layers == scan
    rng = np.random.default_rng(0)
    tokens, positions, mask = padded_batch(rng, cfg.vocab_size, 3, 16, left_pad=5, right_pad=4)
    ours, _ = fwd(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
    ref = hf_logits(hf, tokens, positions, mask)
    diff = np.abs(np.asarray(ours) - ref)[mask]
    assert diff.max() <= 1e-4, diff.max()
    # The window matters: the last token's logits differ from a full-causal forward.
    if window is not None:
        full = dataclasses.replace(loaded_cfg, sliding_window=None)
        model.cfg = full
        ours_full, _ = fwd(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask))
        assert np.abs(np.asarray(ours_full) - np.asarray(ours))[0, -1].max() > 1e-3


def _model(cfg, seed=0):
    return Decoder(cfg, rngs=nnx.Rngs(seed))


@nnx.jit
def fwd(model, tokens, positions, mask=None, cache=None):
    return model(tokens, positions, mask, cache=cache)


@pytest.mark.slow
@pytest.mark.parametrize("window", [None, 4])
def test_cached_decoding_equals_full_forward(window):
    cfg = dataclasses.replace(CFG, sliding_window=window)
    model = _model(cfg)
    rng = np.random.default_rng(1)
    B, L, P = 3, 12, 5
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, L)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    full, _ = fwd(model, tokens, positions)

    # Ragged prefill: row b has P - b prompt tokens (right padding), then token-by-token decoding.
    cache = init_cache(cfg, B, 16)
    plen = np.array([P, P - 1, P - 2])
    mask = jnp.asarray(np.arange(P)[None, :] < plen[:, None])
    logits, cache = fwd(model, tokens[:, :P], positions[:, :P], mask, cache)
    np.testing.assert_array_equal(np.asarray(cache.lengths_B), plen)
    for b in range(B):
        np.testing.assert_allclose(logits[b, : plen[b]], full[b, : plen[b]], atol=1e-5)
    cur = plen.copy()
    while cur.min() < L:
        idx = np.minimum(cur, L - 1)
        tok = tokens[jnp.arange(B), idx][:, None]
        live = jnp.asarray(cur < L)[:, None]
        logits, cache = fwd(model, tok, jnp.asarray(idx)[:, None], live, cache)
        for b in range(B):
            if cur[b] < L:
                np.testing.assert_allclose(logits[b, 0], full[b, cur[b]], atol=1e-5)
        cur = cur + (cur < L)
    np.testing.assert_array_equal(np.asarray(cache.lengths_B), [L] * B)


@pytest.mark.slow
def test_rewind_overwrites_stale_slots():
    model = _model(CFG)
    rng = np.random.default_rng(2)
    a = jnp.asarray(rng.integers(0, CFG.vocab_size, (1, 8)), jnp.int32)
    detour = jnp.asarray(rng.integers(0, CFG.vocab_size, (1, 3)), jnp.int32)
    pos = jnp.arange(8, dtype=jnp.int32)[None]
    full, _ = fwd(model, a, pos)
    cache = init_cache(CFG, 1, 16)
    _, cache = fwd(model, a[:, :5], pos[:, :5], cache=cache)
    _, cache = fwd(model, detour, pos[:, 5:8], cache=cache)  # an API call we then remove
    cache = cache.replace(lengths_B=jnp.array([5], jnp.int32))
    logits, cache = fwd(model, a[:, 5:], pos[:, 5:], cache=cache)
    np.testing.assert_allclose(logits, full[:, 5:], atol=1e-5)
    assert isinstance(cache, KVCache) and int(cache.lengths_B[0]) == 8


def test_cache_write_past_end_is_dropped():
    model = _model(CFG)
    cache = init_cache(CFG, 1, 4)
    tok = jnp.zeros((1, 3), jnp.int32)
    _, cache = fwd(model, tok, jnp.arange(3)[None], cache=cache)
    k_before = np.asarray(cache.slot_major()[0])
    _, cache2 = fwd(model, tok, jnp.arange(3, 6)[None], cache=cache)
    # Slot 3 is written; slots 0..2 are untouched (no clamping of the write position).
    np.testing.assert_array_equal(np.asarray(cache2.slot_major()[0])[:, :, :3], k_before[:, :, :3])


@pytest.mark.slow
def test_bfloat16_params_and_compute_close_to_float32():
    model32 = _model(CFG)
    cfg16 = dataclasses.replace(CFG, param_dtype="bfloat16", compute_dtype="bfloat16")
    model16 = _model(cfg16)
    assert layer_param(model16, 0, "attn", "q", "kernel").dtype == jnp.bfloat16
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, 256, (2, 10)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(10), (2, 10))
    l32, _ = fwd(model32, tokens, pos)
    l16, _ = fwd(model16, tokens, pos)
    assert l16.dtype == jnp.float32
    assert float(jnp.abs(l16 - l32).max()) < 0.25 * float(jnp.abs(l32).max())
    cache = init_cache(cfg16, 2, 12)
    assert cache.k_LxBxKxHxS.dtype == cache.v_LxBxKxSxH.dtype == jnp.bfloat16


@pytest.mark.slow
def test_remat_same_values_and_grads():
    cfg_r = dataclasses.replace(CFG, remat=True)
    m, mr = _model(CFG), _model(cfg_r)
    tokens = jnp.asarray(np.random.default_rng(4).integers(0, 256, (2, 8)), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(8), (2, 8))

    def loss(model):
        return model(tokens, pos)[0].mean()

    g = nnx.jit(nnx.grad(loss))(m)
    gr = nnx.jit(nnx.grad(loss))(mr)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(gr)):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_heads_must_be_multiple_of_kv_heads():
    with pytest.raises(ValueError, match="n_kv_heads"):
        _model(dataclasses.replace(CFG, n_kv_heads=3))
