"""Orbax: save -> restore -> identical logits, base and LoRA separately, into another mesh; clear errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.checkpoint import read_stored, restore_params, save_params
from memllm_jax.config import LoraConfig, MeshConfig, ModelConfig
from memllm_jax.model.lora import lora_modules
from memllm_jax.model.decoder import Decoder
from memllm_jax.model.placement import abstract_model
from memllm_jax.sharding import make_mesh, state_shardings

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=None, max_seq_len=32)
LORA = LoraConfig(rank=4, dropout=0.1, targets=("q", "v", "down", "lm_head"))
TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 128, (4, 8)), jnp.int32)
POS = jnp.broadcast_to(jnp.arange(8, dtype=jnp.int32), (4, 8))


@nnx.jit
def fwd(model):
    return model(TOKENS, POS)[0]


def _trained_like(seed):
    model = Decoder(CFG, LORA, rngs=nnx.Rngs(seed))
    rng = np.random.default_rng(seed)
    for _, linear in lora_modules(model):
        linear.lora.b[...] = jnp.asarray(0.1 * rng.standard_normal(linear.lora.b[...].shape), jnp.float32)
    return model


@pytest.mark.slow
def test_save_restore_sharded_into_other_mesh(tmp_path):
    model = _trained_like(0)
    mesh_a = make_mesh(MeshConfig(2, 2, 2))
    graphdef, state = nnx.split(model)
    model = nnx.merge(graphdef, jax.device_put(state, state_shardings(state, mesh_a)))
    expected = np.asarray(fwd(model))
    save_params(tmp_path, 3, model)
    stored = read_stored(tmp_path)
    cfg, lora = stored.model, stored.lora
    assert (cfg, lora, stored.step) == (CFG, LORA, 3)
    mesh_b = make_mesh(MeshConfig(1, 4, 2))
    restored = restore_params(tmp_path, abstract_model(cfg, lora, mesh_b))
    q = restored.layers.attn.q.kernel[...]
    assert q.sharding.mesh.shape == mesh_b.shape and q.sharding.spec[:2] == (None, "fsdp")
    np.testing.assert_allclose(np.asarray(fwd(restored)), expected, atol=1e-6)


@pytest.mark.slow
def test_base_and_lora_separately_and_adapter_restore(tmp_path):
    model = _trained_like(1)
    save_params(tmp_path / "full", 0, model)
    save_params(tmp_path / "adapter", 7, model, lora_only=True)
    expected = np.asarray(fwd(model))
    assert (tmp_path / "full" / "0" / "base").is_dir() and (tmp_path / "full" / "0" / "lora").is_dir()
    assert not (tmp_path / "adapter" / "7" / "base").exists()
    # The adapter alone restores onto a model holding the same base.
    other = _trained_like(1)
    for _, linear in lora_modules(other):
        linear.lora.b[...] = jnp.zeros_like(linear.lora.b[...])
    assert np.abs(np.asarray(fwd(other)) - expected).max() > 1e-3
    restore_params(tmp_path / "adapter", other)
    np.testing.assert_allclose(np.asarray(fwd(other)), expected, atol=1e-6)
    with pytest.raises(ValueError, match="no base parameters"):
        restore_params(tmp_path / "adapter", abstract_model(CFG, LORA, None))
    # A base-only model from the full checkpoint.
    base = restore_params(tmp_path / "full", Decoder(CFG, rngs=nnx.Rngs(5)))
    np.testing.assert_array_equal(base.embed[...], model.embed[...])


def test_checkpoint_of_another_shape(tmp_path):
    save_params(tmp_path, 0, Decoder(CFG, rngs=nnx.Rngs(0)))
    wider = dataclasses.replace(CFG, d_ff=96)
    with pytest.raises(ValueError, match=r"item 'base'\): parameter 'layers.mlp.down.kernel' has shape \(2, 64, 32\)"):
        restore_params(tmp_path, abstract_model(wider, None, None))
    with pytest.raises(FileNotFoundError, match="step 4"):
        restore_params(tmp_path, abstract_model(CFG, None, None), step=4)
    with pytest.raises(FileNotFoundError, match="no Orbax checkpoint"):
        restore_params(tmp_path / "empty", abstract_model(CFG, None, None))


@pytest.mark.slow
def test_convert_cli_both_directions(tmp_path):
    from safetensors.numpy import load_file

    from memllm_jax.cli import main
    from tests.support.hf_models import save_hf_mistral

    save_hf_mistral(CFG, tmp_path / "hf", seed=3)
    assert main(["convert", "hf-to-orbax", str(tmp_path / "hf"), str(tmp_path / "ckpt")]) == 0
    assert main(["convert", "orbax-to-hf", str(tmp_path / "ckpt"), str(tmp_path / "back")]) == 0
    a, b = load_file(tmp_path / "hf" / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("saved_scan", [False, True], ids=["unrolled-into-scanned", "scanned-into-unrolled"])
def test_restore_into_the_other_layer_layout(tmp_path, saved_scan):
    saved_cfg = dataclasses.replace(CFG, scan_layers=saved_scan)
    model = Decoder(saved_cfg, LORA, rngs=nnx.Rngs(2))
    rng = np.random.default_rng(2)
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        var[...] = jnp.asarray(0.1 * rng.standard_normal(var[...].shape), jnp.float32)
    save_params(tmp_path, 0, model)
    other = dataclasses.replace(CFG, scan_layers=not saved_scan)
    mesh = make_mesh(MeshConfig(1, 4, 2))
    restored = restore_params(tmp_path, abstract_model(other, LORA, mesh))
    assert restored.cfg.scan_layers == (not saved_scan)
    q = restored.layers.attn.q.kernel[...] if not saved_scan else restored.layers[1].attn.q.kernel[...]
    assert q.sharding.spec[: 2 - saved_scan] == ((None, "fsdp") if not saved_scan else ("fsdp",))
    np.testing.assert_allclose(np.asarray(fwd(restored)), np.asarray(fwd(model)), atol=1e-5)


def test_checkpoint_without_scan_field_reads_as_unrolled(tmp_path):
    import json

    save_params(tmp_path, 0, Decoder(dataclasses.replace(CFG, scan_layers=False), rngs=nnx.Rngs(0)))
    config_file = tmp_path / "0" / "config" / "metadata"
    stored = json.loads(config_file.read_text())
    del stored["model"]["scan_layers"]
    config_file.write_text(json.dumps(stored))
    assert read_stored(tmp_path).model.scan_layers is False
