"""`placement.materialize`: the fresh leaves of a model whose base weights are given (adapters, RNG state) get the
values of the whole model's jitted initialiser, bitwise, whether drawn op by op (one device) or under jit (several)."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import LoraConfig, MeshConfig, ModelConfig
from memllm_jax.model.decoder import Decoder
from memllm_jax.model.placement import abstract_model, materialize
from memllm_jax.sharding import make_mesh

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  max_seq_len=32)
LORA = LoraConfig(rank=4, dropout=0.1, trainable_tokens=(126, 127))


def host_values(state) -> dict:
    out = {}
    for path, var in nnx.to_flat_state(state):
        value = var.get_value()
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        out[path] = np.asarray(value)
    return out


def reference(cfg: ModelConfig, seed: int) -> dict:
    """Every leaf of the model as `jax.jit` initialises it (the `jax.random` path of `model.init`)."""
    return host_values(jax.jit(lambda: nnx.state(Decoder(cfg, LORA, rngs=nnx.Rngs(seed))))())


def with_base_given(cfg: ModelConfig, mesh, seed: int):
    """The abstract model with its base parameters set (as `model.load` does for pretrained weights) and the rest
    still abstract."""
    graphdef, abstract = abstract_model(cfg, LORA, mesh, seed)
    base = Decoder(cfg, None, rngs=nnx.Rngs(99))  # other weights: they must stay as given
    given = dict(nnx.to_flat_state(nnx.state(base)))
    for path, var in nnx.to_flat_state(abstract):
        if path in given:
            var.set_value(given[path].get_value())
    return graphdef, abstract, host_values(nnx.state(base))


@pytest.mark.slow
def test_materialize_draws_the_fresh_leaves_as_the_jitted_initialiser_on_one_device_and_on_eight():
    one, eight = make_mesh(MeshConfig(), jax.devices()[:1]), make_mesh(MeshConfig(data=1, fsdp=8, tensor=1))
    for cfg, mesh in ((CFG, one), (CFG, eight), (dataclasses.replace(CFG, scan_layers=True), one)):
        want = reference(cfg, seed=5)
        graphdef, abstract, base = with_base_given(cfg, mesh, seed=5)
        got = host_values(nnx.state(materialize(graphdef, abstract, seed=5)))
        assert got.keys() == want.keys()
        fresh = [p for p in got if p not in base]
        assert any("lora" in p for p in fresh) and any("token_lora" in p for p in fresh)
        for path, value in got.items():
            np.testing.assert_array_equal(value, base[path] if path in base else want[path], err_msg=str(path))
