"""Meshes on 8 fake CPU devices: sharded forward equals single device, shardings follow the rule table."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from memllm_jax.config import MISTRAL_7B, LoraConfig, MeshConfig, ModelConfig
from memllm_jax.model.decoder import Decoder
from memllm_jax.model.placement import abstract_model, create_sharded_model, param_bytes
from memllm_jax.sharding import batch_sharding, make_mesh, state_shardings

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=6, max_seq_len=32)
LORA = LoraConfig(rank=4, dropout=0.0)


def test_make_mesh_sizes_and_errors():
    assert dict(make_mesh(MeshConfig()).shape) == {"data": 8, "fsdp": 1, "tensor": 1}
    assert dict(make_mesh(MeshConfig(data=-1, fsdp=2, tensor=2)).shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError, match="devices"):
        make_mesh(MeshConfig(data=3, fsdp=1, tensor=1))
    with pytest.raises(ValueError, match="-1"):
        make_mesh(MeshConfig(data=-1, fsdp=-1, tensor=1))


@pytest.fixture(scope="module", params=[False, True], ids=["unrolled", "scan"])
def reference(request):
    model = Decoder(dataclasses.replace(CFG, scan_layers=request.param), LORA, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    for _, state in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)):
        state[...] = jnp.asarray(0.1 * rng.standard_normal(state[...].shape), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (8, 12)), jnp.int32)
    mask = jnp.ones((8, 12), bool).at[3, 9:].set(False)
    positions = jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (8, 12))
    graphdef, state = nnx.split(model)
    logits = _forward(graphdef)(state, tokens, positions, mask)
    return graphdef, state, (tokens, positions, mask), np.asarray(logits)


def _forward(graphdef):
    @jax.jit
    def f(state, tokens, positions, mask):
        return nnx.merge(graphdef, state)(tokens, positions, mask)[0]

    return f


@pytest.mark.slow
@pytest.mark.parametrize("shape", [(8, 1, 1), (2, 2, 2), (1, 4, 2)])
def test_sharded_forward_equals_single_device(reference, shape):
    graphdef, state, batch, expected = reference
    mesh = make_mesh(MeshConfig(*shape))
    shardings = state_shardings(state, mesh)
    sharded = jax.device_put(state, shardings)
    batch = [jax.device_put(x, batch_sharding(mesh)) for x in batch]
    with jax.set_mesh(mesh):
        logits = _forward(graphdef)(sharded, *batch)
    np.testing.assert_allclose(np.asarray(logits), expected, atol=1e-5)
    flat = dict(nnx.to_flat_state(sharded))
    fsdp = "fsdp" if shape[1] > 1 else None
    tensor = "tensor" if shape[2] > 1 else None
    scan = ("layers", "attn", "q", "kernel") in flat  # scanned: one stacked array, its layer axis replicated
    layer = {i: ("layers",) if scan else ("layers", i) for i in (0, 1)}
    row = (None,) if scan else ()
    expect = {
        ("embed",): P(tensor, fsdp),
        (*layer[0], "attn", "q", "kernel"): P(*row, fsdp, tensor, None),
        (*layer[0], "attn", "k", "kernel"): P(*row, fsdp, tensor, None),
        (*layer[0], "attn", "o", "kernel"): P(*row, tensor, None, fsdp),
        (*layer[1], "mlp", "down", "kernel"): P(*row, tensor, fsdp),
        (*layer[1], "mlp", "down", "lora", "a"): P(*row, tensor, None),
        (*layer[1], "mlp", "down", "lora", "b"): P(*row, None, fsdp),
        (*layer[1], "mlp_norm", "scale"): P(*row, None),
        ("lm_head", "kernel"): P(fsdp, tensor),
    }
    for path, spec in expect.items():
        got = flat[path][...].sharding.spec
        assert tuple(got) + (None,) * (len(spec) - len(got)) == tuple(spec), (path, got, spec)


@pytest.mark.slow
def test_create_sharded_model_abstract_init():
    mesh = make_mesh(MeshConfig(1, 4, 2))
    model = create_sharded_model(CFG, None, mesh, seed=0)
    q = model.layers.attn.q.kernel[...]
    assert q.sharding.spec == P(None, "fsdp", "tensor", None)
    assert len(q.addressable_shards) == 8 and q.addressable_shards[0].data.shape == (2, 8, 2, 8)
    assert float(jnp.std(q)) == pytest.approx(CFG.d_model**-0.5, rel=0.2)
    graphdef, abstract = abstract_model(CFG, None, mesh)
    assert abstract["embed"].sharding.spec == P("tensor", "fsdp")


def test_heads_not_divisible_by_tensor_axis():
    mesh = make_mesh(MeshConfig(1, 2, 4))
    with pytest.raises(ValueError, match=r"ModelConfig.n_kv_heads=2 is not divisible by the mesh axis tensor=4"):
        abstract_model(CFG, None, mesh)
    bad = dataclasses.replace(CFG, n_heads=6, n_kv_heads=2, head_dim=4)
    with pytest.raises(ValueError, match=r"ModelConfig.n_heads=6"):
        abstract_model(bad, None, make_mesh(MeshConfig(2, 1, 4)))


def test_param_bytes_mistral_7b_from_abstract_shapes():
    mesh = make_mesh(MeshConfig(1, 4, 2))
    total, per_device = param_bytes(MISTRAL_7B, None, mesh)
    n_params = 7_241_732_096  # Mistral-7B-v0.1
    assert total == 4 * n_params
    norms = 4 * (2 * 32 + 1) * 4096
    assert per_device == (total - norms) // 8 + norms


def test_model_size_command(capsys):
    from memllm_jax.cli import main

    assert main(["model-size", "--preset", "mistral_7b", "--mesh", "1,4,2"]) == 0
    out = capsys.readouterr().out
    assert "7,241,732,096" in out and "28,966,928,384" in out and "3,621,797,888" in out


@pytest.mark.slow
def test_sharded_cache_decoding_matches(reference):
    from memllm_jax.model.decoder import init_cache
    from memllm_jax.model.placement import cache_shardings

    graphdef, state, (tokens, positions, mask), expected = reference
    mesh = make_mesh(MeshConfig(1, 4, 2))
    sharded = jax.device_put(state, state_shardings(state, mesh))
    cache = jax.device_put(init_cache(CFG, 8, 16), cache_shardings(CFG, mesh, 8, 16))
    for kv in (cache.k_LxBxKxHxS, cache.v_LxBxKxSxH):  # rows over "fsdp", kv heads over "tensor"
        assert tuple(kv.sharding.spec)[:3] == (None, "fsdp", "tensor")

    @jax.jit
    def step(state, tokens, positions, mask, cache):
        return nnx.merge(graphdef, state)(tokens, positions, mask, cache=cache)

    with jax.set_mesh(mesh):
        logits, cache = step(sharded, tokens[:, :9], positions[:, :9], mask[:, :9], cache)
    rows = np.asarray(mask[:, :9])
    np.testing.assert_allclose(np.asarray(logits)[rows], expected[:, :9][rows], atol=1e-5)
