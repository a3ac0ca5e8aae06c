"""LoRA: separate subtree, zero-init B, alpha/r scaling, dropout, targets, merge, adapter swap, training."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.model.lora import BASE_PARAMS, lora_modules, merge_lora
from memllm_jax.model.decoder import Decoder

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=None, max_seq_len=32)
LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.0)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 128, (2, 10)), jnp.int32)
POS = jnp.broadcast_to(jnp.arange(10, dtype=jnp.int32), (2, 10))


@nnx.jit(static_argnames="deterministic")
def fwd(model, deterministic=True):
    return model(TOKENS, POS, deterministic=deterministic)[0]


def _randomise_b(model, seed):
    rng = np.random.default_rng(seed)
    for _, linear in lora_modules(model):
        b = linear.lora.b[...]
        linear.lora.b[...] = jnp.asarray(0.1 * rng.standard_normal(b.shape), b.dtype)


@pytest.mark.slow
def test_fresh_lora_equals_base_and_base_tree_unchanged():
    base = Decoder(CFG, rngs=nnx.Rngs(3))
    lora = Decoder(CFG, LORA, rngs=nnx.Rngs(3))
    np.testing.assert_array_equal(fwd(base), fwd(lora))
    base_state = nnx.to_flat_state(nnx.state(base, nnx.Param))
    lora_base = nnx.to_flat_state(nnx.state(lora, BASE_PARAMS))
    assert [p for p, _ in base_state] == [p for p, _ in lora_base]
    for (_, a), (_, b) in zip(base_state, lora_base):
        np.testing.assert_array_equal(a[...], b[...])
    adapter_paths = [p for p, _ in nnx.to_flat_state(nnx.state(lora, nnx.LoRAParam))]
    assert adapter_paths and all(any("lora" in str(k) for k in p) for p in adapter_paths)
    # 7 targets per layer (one stacked module for all layers when scanned) + lm_head, each with a and b.
    assert len(adapter_paths) == 2 * (7 * (1 if CFG.scan_layers else CFG.n_layers) + 1)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_scaling_matches_explicit_merged_kernel(scan):
    cfg = dataclasses.replace(CFG, scan_layers=scan)
    model = Decoder(cfg, LORA, rngs=nnx.Rngs(0))
    _randomise_b(model, 1)
    before = fwd(model)
    q = model.layers.attn.q if scan else model.layers[0].attn.q
    a, b = np.asarray(q.lora.a[...]), np.asarray(q.lora.b[...])
    expected = np.asarray(q.kernel[...]) + (LORA.alpha / LORA.rank) * np.einsum("...dr,...rnh->...dnh", a, b)
    assert np.abs(before - fwd(Decoder(cfg, LORA, rngs=nnx.Rngs(0)))).max() > 1e-3
    merge_lora(model)
    np.testing.assert_allclose(np.asarray(q.kernel[...]), expected, atol=1e-6)
    np.testing.assert_allclose(fwd(model), before, atol=1e-5)
    assert all(float(jnp.abs(m.lora.b[...]).max()) == 0 for _, m in lora_modules(model))


def test_targets_subset_and_unknown_target():
    model = Decoder(CFG, dataclasses.replace(LORA, targets=("q", "v", "lm_head")), rngs=nnx.Rngs(0))
    names = {tuple(str(k) for k in path)[-1] for path, _ in lora_modules(model)}
    assert names == {"q", "v", "lm_head"}
    with pytest.raises(ValueError, match="targets"):
        Decoder(CFG, dataclasses.replace(LORA, targets=("qkv",)), rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_dropout_only_in_training_mode():
    model = Decoder(CFG, dataclasses.replace(LORA, dropout=0.5, targets=("q", "lm_head")), rngs=nnx.Rngs(0))
    _randomise_b(model, 2)
    eval_a, eval_b = fwd(model), fwd(model)
    np.testing.assert_array_equal(eval_a, eval_b)
    train_a, train_b = fwd(model, deterministic=False), fwd(model, deterministic=False)
    assert np.abs(train_a - eval_a).max() > 1e-4
    assert np.abs(train_a - train_b).max() > 1e-4  # a fresh mask per call


@pytest.mark.slow
def test_adapter_swap_on_one_base():
    model = Decoder(CFG, LORA, rngs=nnx.Rngs(0))
    _randomise_b(model, 10)
    write_adapter = jax.tree.map(jnp.copy, nnx.state(model, nnx.LoRAParam))
    out_write = fwd(model)
    _randomise_b(model, 11)
    read_adapter = jax.tree.map(jnp.copy, nnx.state(model, nnx.LoRAParam))
    out_read = fwd(model)
    assert np.abs(out_write - out_read).max() > 1e-3
    nnx.update(model, write_adapter)
    np.testing.assert_array_equal(fwd(model), out_write)
    nnx.update(model, read_adapter)
    np.testing.assert_array_equal(fwd(model), out_read)


@pytest.mark.slow
def test_training_updates_only_lora():
    model = Decoder(CFG, LORA, rngs=nnx.Rngs(0))
    base_before = jax.tree.map(jnp.copy, nnx.state(model, BASE_PARAMS))
    opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.LoRAParam)

    @nnx.jit
    def step(model, opt):
        def loss_fn(model):
            logits = model(TOKENS[:, :-1], POS[:, :-1], deterministic=False)[0]
            return optax.softmax_cross_entropy_with_integer_labels(logits, TOKENS[:, 1:]).mean()

        loss, grads = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, nnx.LoRAParam))(model)
        opt.update(model, grads)
        return loss

    losses = [float(step(model, opt)) for _ in range(5)]
    assert losses[-1] < losses[0]
    for a, b in zip(jax.tree.leaves(base_before), jax.tree.leaves(nnx.state(model, BASE_PARAMS))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_trainable_tokens_rows():
    lora = dataclasses.replace(LORA, trainable_tokens=(5, 9))
    model = Decoder(CFG, lora, rngs=nnx.Rngs(0))
    base_out = fwd(Decoder(CFG, rngs=nnx.Rngs(0)))
    np.testing.assert_array_equal(fwd(model), base_out)
    assert model.token_lora.delta[...].shape == (2, CFG.d_model)
    assert isinstance(model.token_lora.delta, nnx.LoRAParam)
    delta = jnp.asarray(np.random.default_rng(0).standard_normal((2, CFG.d_model)), jnp.float32)
    model.token_lora.delta[...] = delta
    tokens = jnp.asarray([[5, 1, 9, 2]], jnp.int32)
    x = model.token_lora(tokens, jnp.take(model.embed[...], tokens, axis=0))
    np.testing.assert_allclose(x[0, 0], model.embed[5] + delta[0], rtol=1e-6)
    np.testing.assert_allclose(x[0, 1], model.embed[1], rtol=1e-6)
    np.testing.assert_allclose(x[0, 2], model.embed[9] + delta[1], rtol=1e-6)
    before = fwd(model)
    merge_lora(model)
    np.testing.assert_allclose(fwd(model), before, atol=1e-5)
    with pytest.raises(ValueError, match="trainable_tokens"):
        Decoder(CFG, dataclasses.replace(LORA, trainable_tokens=(CFG.vocab_size,)), rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_tied_head_scores_trained_rows_as_merged():
    """A tied head adds `x @ delta^T` in the trained ids' columns: the logits and the gradient of `delta` equal
    those of the merged embedding `embed.at[ids].set(embed[ids] + delta)` used as the head."""
    cfg = dataclasses.replace(CFG, tie_embeddings=True)
    model = Decoder(cfg, dataclasses.replace(LORA, trainable_tokens=(5, 9, 100)), rngs=nnx.Rngs(1))
    model.token_lora.delta[...] = jnp.asarray(np.random.default_rng(2).standard_normal((3, cfg.d_model)), jnp.float32)
    x_BxLxD = jnp.asarray(np.random.default_rng(3).standard_normal((2, 4, cfg.d_model)), jnp.float32)
    embed = model.embed[...]
    target_BxLxV = jnp.asarray(np.random.default_rng(4).standard_normal((2, 4, cfg.vocab_size)), jnp.float32)

    def via_columns(token_lora):
        return jnp.sum(target_BxLxV * token_lora.add_head_scores(x_BxLxD, x_BxLxD @ embed.T))

    def via_merged(token_lora):
        return jnp.sum(target_BxLxV * (x_BxLxD @ token_lora.merged_embedding(embed).T))

    wrt_delta = nnx.DiffState(0, nnx.LoRAParam)
    np.testing.assert_allclose(via_columns(model.token_lora), via_merged(model.token_lora), rtol=1e-5)
    grads = [nnx.grad(f, argnums=wrt_delta)(model.token_lora).delta[...] for f in (via_columns, via_merged)]
    np.testing.assert_allclose(*grads, rtol=1e-4, atol=1e-4)
    assert float(jnp.abs(grads[0]).max()) > 0
    before = fwd(model)
    merge_lora(model)
    np.testing.assert_allclose(fwd(model), before, atol=1e-4)
