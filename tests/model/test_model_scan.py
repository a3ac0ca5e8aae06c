"""Scanned layers (`ModelConfig.scan_layers`) equal the unrolled Python loop: forward, gradients (with LoRA,
trainable tokens, dropout, remat and packed segments), KV-cache decoding in both cache forms, PEFT export and HF
round trips (the read loop: tests/decode/test_decode_parity.py)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.model.lora import merge_lora
from memllm_jax.model.decoder import Decoder, init_cache, stack_blocks, stack_cache, unstack_cache
from memllm_jax.train.loss import masked_cross_entropy

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=5, max_seq_len=64, scan_layers=False)
LORA = LoraConfig(rank=4, dropout=0.3, trainable_tokens=(3, 7))


def _pair(cfg=CFG, lora=LORA):
    """The same model unrolled and scanned, with random adapters (the scanned one stacked from the unrolled)."""
    unrolled = Decoder(cfg, lora, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    for _, var in nnx.to_flat_state(nnx.state(unrolled, nnx.LoRAParam)):
        var[...] = jnp.asarray(0.2 * rng.standard_normal(var[...].shape), jnp.float32)
    scanned = Decoder(dataclasses.replace(cfg, scan_layers=True), lora, rngs=nnx.Rngs(0))
    nnx.update(scanned, nnx.state(unrolled, nnx.LoRAParam).filter(lambda path, _: path[0] != "layers"))
    nnx.update(scanned.layers, nnx.state(stack_blocks(list(unrolled.layers))))
    return unrolled, scanned


def _batch(B=3, L=12):
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, L)), jnp.int32).at[0, 2].set(3)
    segments = jnp.asarray(np.repeat([[1] * 7 + [2] * 5], B, axis=0), jnp.int32)
    positions = jnp.asarray(np.concatenate([np.arange(7), np.arange(5)])[None].repeat(B, 0), jnp.int32)
    return tokens, positions, segments


@pytest.mark.slow
def test_same_seed_same_weights():
    unrolled = Decoder(CFG, LORA, rngs=nnx.Rngs(4))
    scanned = Decoder(dataclasses.replace(CFG, scan_layers=True), LORA, rngs=nnx.Rngs(4))
    q = scanned.layers.attn.q.kernel[...]
    assert q.shape == (CFG.n_layers, 32, 4, 8)
    assert scanned.layers.attn.q.kernel.get_metadata()["logical_axes"][0] == "layers"
    for i, block in enumerate(unrolled.layers):
        np.testing.assert_array_equal(q[i], block.attn.q.kernel[...])


@pytest.mark.slow
@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_forward_and_gradients_equal_unrolled(remat):
    cfg = dataclasses.replace(CFG, remat=remat, remat_policy="dots_with_no_batch_dims_saveable")
    tokens, positions, segments = _batch()
    targets = jnp.roll(tokens, -1, axis=1)
    outs = []
    for model in _pair(cfg):
        graphdef, params, rest = nnx.split(model, nnx.LoRAParam, ...)

        @jax.jit
        def loss(params, rest):
            m = nnx.merge(graphdef, params, rest, copy=True)
            logits, _ = m(tokens, positions, deterministic=False, segment_ids_BxL=segments)
            total, n = masked_cross_entropy(logits, targets, jnp.ones_like(tokens, bool))
            return total / n, (logits, nnx.state(m, nnx.RngState))  # normalised as in training

        (_, (logits, rng_state)), grads = jax.value_and_grad(loss, has_aux=True)(params, rest)
        layer_grads = grads["layers"]
        if not model.cfg.scan_layers:  # {0: block grads, 1: ...} -> one tree stacked on the layer axis
            layer_grads = jax.tree.map(lambda *g: jnp.stack(g), *[layer_grads[i] for i in range(cfg.n_layers)])
        others = {k: v for k, v in grads.items() if k != "layers"}
        counts = [c for p, c in jax.tree_util.tree_leaves_with_path(rng_state) if "count" in jax.tree_util.keystr(p)]
        outs.append((logits, nnx.to_pure_dict(layer_grads), nnx.to_pure_dict(nnx.State(others)),
                     sum(int(jnp.sum(c)) for c in counts)))
    (l0, g0, o0, n0), (l1, g1, o1, n1) = outs
    np.testing.assert_allclose(l0, l1, atol=1e-5)
    assert n0 == n1 > 0  # the same dropout draws, counters advanced the same way
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g0, g1)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), o0, o1)
    assert float(jnp.abs(o1["token_lora"]["delta"][...]).max()) > 0


@pytest.mark.slow
def test_cached_decoding_equals_unrolled_in_both_cache_forms():
    unrolled, scanned = _pair()
    tokens, positions, _ = _batch(L=10)
    fwd = nnx.jit(lambda m, t, p, mask, cache: m(t, p, mask, cache=cache))
    mask = jnp.ones((3, 6), bool).at[2, 4:].set(False)
    results = []
    for model, layered in ((unrolled, True), (scanned, False), (scanned, True)):
        cache = init_cache(CFG, 3, 16)
        cache = unstack_cache(cache) if layered else cache
        logits, cache = fwd(model, tokens[:, :6], positions[:, :6], mask, cache)
        steps = [logits]
        for i in range(6, 10):
            logits, cache = fwd(model, tokens[:, i:i + 1], cache.lengths_B[:, None], None, cache)
            steps.append(logits)
        assert isinstance(cache.k_LxBxKxHxS, tuple) == layered
        results.append((steps, stack_cache(cache)))
    for steps, cache in results[1:]:
        for a, b in zip(results[0][0], steps):
            np.testing.assert_allclose(a, b, atol=1e-5)
        np.testing.assert_allclose(results[0][1].k_LxBxKxHxS, cache.k_LxBxKxHxS, atol=1e-5)
        np.testing.assert_allclose(results[0][1].v_LxBxKxSxH, cache.v_LxBxKxSxH, atol=1e-5)
        np.testing.assert_array_equal(results[0][1].lengths_B, cache.lengths_B)


@pytest.mark.slow
def test_merge_lora_and_peft_export_equal_unrolled(tmp_path):
    from safetensors.numpy import load_file

    from memllm_jax.model.hf import hf_tensors, save_peft_adapter

    unrolled, scanned = _pair()
    for model, name in ((unrolled, "u"), (scanned, "s")):
        save_peft_adapter(model, tmp_path / name)
    a, b = (load_file(tmp_path / n / "adapter_model.safetensors") for n in ("u", "s"))
    assert set(a) == set(b) and "base_model.model.model.layers.2.mlp.down_proj.lora_B.weight" in a
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    merged = [dict(hf_tensors(m, merge_lora=True)) for m in (unrolled, scanned)]
    for k in merged[0]:
        np.testing.assert_allclose(merged[0][k], merged[1][k], atol=1e-6)
    tokens, positions, _ = _batch()
    before = scanned(tokens, positions)[0]
    merge_lora(scanned)
    np.testing.assert_allclose(scanned(tokens, positions)[0], before, atol=1e-5)


@pytest.mark.slow
def test_unknown_remat_policy_is_named():
    cfg = dataclasses.replace(CFG, scan_layers=True, remat=True, remat_policy="save_all")
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    tokens, positions, _ = _batch()
    with pytest.raises(ValueError, match="ModelConfig.remat_policy='save_all'"):
        model(tokens, positions)


def test_stack_layers_scans_an_unrolled_model_in_place():
    """`stack_layers` (the pipeline's evaluation models): the same weights stacked, the same logits, the LoRA-free
    merged form included; a scanned model is left as it is."""
    from memllm_jax.model.decoder import stack_layers

    model = Decoder(CFG, rngs=nnx.Rngs(2))
    tokens, positions, _ = _batch()
    before, _ = model(tokens, positions)
    q = [block.attn.q.kernel[...] for block in model.layers]
    stack_layers(model)
    assert model.cfg.scan_layers and model.layers.attn.q.kernel[...].shape == (CFG.n_layers, 32, 4, 8)
    np.testing.assert_array_equal(model.layers.attn.q.kernel[...], jnp.stack(q))
    after, _ = model(tokens, positions)
    np.testing.assert_allclose(after, before, atol=1e-5)
    layers = model.layers
    stack_layers(model)
    assert model.layers is layers
