"""HF interop: round trip bit-identical, sharded safetensors, clear errors, PEFT adapter parity, extra tokens."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from memllm_jax.config import LoraConfig, MeshConfig, ModelConfig
from memllm_jax.model.hf import INDEX_FILE, load_hf, save_hf, save_peft_adapter
from memllm_jax.model.lora import lora_modules
from tests.support.hf_models import hf_logits, padded_batch, save_hf_mistral
from memllm_jax.sharding import make_mesh

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=None, max_seq_len=32)


@nnx.jit
def fwd(model, tokens, positions, mask):
    return model(tokens, positions, mask)[0]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("hf")
    save_hf_mistral(CFG, directory, seed=0)
    return directory


def _read_all(directory):
    tensors = {}
    for f in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(f))
    return tensors


@pytest.mark.slow
def test_round_trip_bit_identical_single_and_sharded(hf_dir, tmp_path):
    cfg, model = load_hf(hf_dir)
    assert cfg.vocab_size == CFG.vocab_size and cfg.n_kv_heads == 2
    save_hf(model, tmp_path / "sharded", max_shard_bytes=40_000)
    assert (tmp_path / "sharded" / INDEX_FILE).exists()
    assert len(list((tmp_path / "sharded").glob("model-*.safetensors"))) > 1
    _, model2 = load_hf(tmp_path / "sharded", mesh=make_mesh(MeshConfig(2, 2, 2)))
    assert model2.layers.attn.q.kernel[...].sharding.spec[:2] == (None, "fsdp")  # scanned: (layers, embed, ...)
    save_hf(model2, tmp_path / "single")
    original, again = _read_all(hf_dir), _read_all(tmp_path / "single")
    assert set(original) == set(again)
    for name in original:
        assert original[name].dtype == again[name].dtype
        np.testing.assert_array_equal(original[name], again[name], err_msg=name)


@pytest.mark.slow
def test_missing_and_mismatched_files(hf_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_hf(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text((hf_dir / "config.json").read_text())
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_hf(bad)
    # A config whose shapes do not match the weights.
    config = json.loads((hf_dir / "config.json").read_text())
    config["intermediate_size"] = 48
    (bad / "config.json").write_text(json.dumps(config))
    (bad / "model.safetensors").symlink_to(hf_dir / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape"):
        load_hf(bad)
    # A sharded index that names a file that is not there.
    (bad / "config.json").write_text((hf_dir / "config.json").read_text())
    (bad / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(FileNotFoundError, match="model-00001-of-00002.safetensors"):
        load_hf(bad)
    # A tensor missing from the weights.
    (bad / INDEX_FILE).write_text(json.dumps({"weight_map": {"model.embed_tokens.weight": "model.safetensors"}}))
    with pytest.raises(KeyError, match="model.layers.0.input_layernorm.weight"):
        load_hf(bad)
    config["num_hidden_layers"] = None
    del config["num_hidden_layers"]
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        load_hf(bad)


@pytest.mark.slow
def test_peft_adapter_loaded_by_hf_peft_matches(hf_dir, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import MistralForCausalLM

    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.1, trainable_tokens=(125, 127))
    _, model = load_hf(hf_dir, lora=lora)
    rng = np.random.default_rng(0)
    for _, linear in lora_modules(model):
        linear.lora.b[...] = jnp.asarray(0.05 * rng.standard_normal(linear.lora.b[...].shape), jnp.float32)
    model.token_lora.delta[...] = jnp.asarray(rng.standard_normal((2, CFG.d_model)), jnp.float32)
    save_peft_adapter(model, tmp_path / "adapter")
    base = MistralForCausalLM.from_pretrained(hf_dir, attn_implementation="eager", dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    tokens, positions, mask = padded_batch(rng, CFG.vocab_size, 3, 12, left_pad=3, right_pad=2)
    tokens[:, [4, 7]] = [125, 127]  # the trainable-token rows are used
    ours = np.asarray(fwd(model, jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)))
    ref = hf_logits(peft_model, tokens, positions, mask)
    assert np.abs(ours - ref)[mask].max() <= 1e-4
    with peft_model.disable_adapter():
        base_ref = hf_logits(peft_model, tokens, positions, mask)
    assert np.abs(ours - base_ref)[mask].max() > 1e-3  # the adapter is not a no-op
    # Merged export equals the adapted model, as a plain HF model.
    save_hf(model, tmp_path / "merged", merge_lora=True)
    merged = MistralForCausalLM.from_pretrained(tmp_path / "merged", attn_implementation="eager", dtype=torch.float32)
    assert np.abs(hf_logits(merged.eval(), tokens, positions, mask) - ref)[mask].max() <= 1e-4


@pytest.mark.slow
def test_extra_tokens_rows_are_mean_rows(hf_dir):
    _, base = load_hf(hf_dir)
    cfg, model = load_hf(hf_dir, extra_tokens=3)
    assert cfg.vocab_size == CFG.vocab_size + 3
    embed = np.asarray(model.embed[...])
    np.testing.assert_array_equal(embed[: CFG.vocab_size], np.asarray(base.embed[...]))
    np.testing.assert_allclose(embed[CFG.vocab_size:], np.repeat(embed[: CFG.vocab_size].mean(0, keepdims=True), 3, 0),
                               rtol=1e-6)
    head = np.asarray(model.lm_head.kernel[...])
    np.testing.assert_allclose(head[:, CFG.vocab_size:], np.repeat(head[:, : CFG.vocab_size].mean(1, keepdims=True), 3, 1),
                               rtol=1e-6)
    tokens = jnp.asarray([[1, 2, 3, 4]], jnp.int32)
    pos = jnp.arange(4)[None]
    mask = jnp.ones((1, 4), bool)
    np.testing.assert_allclose(fwd(model, tokens, pos, mask)[..., : CFG.vocab_size], fwd(base, tokens, pos, mask),
                               atol=1e-5)


@pytest.mark.slow
def test_bfloat16_checkpoint_round_trip(tmp_path):
    import torch

    from tests.support.hf_models import hf_mistral

    hf_mistral(CFG, seed=2).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    cfg, model = load_hf(tmp_path / "bf16")
    assert cfg.param_dtype == "bfloat16" and model.embed[...].dtype == jnp.bfloat16
    save_hf(model, tmp_path / "again")
    original, again = _read_all(tmp_path / "bf16"), _read_all(tmp_path / "again")
    for name in original:
        assert again[name].dtype == original[name].dtype
        np.testing.assert_array_equal(original[name].view(np.uint16), again[name].view(np.uint16), err_msg=name)
