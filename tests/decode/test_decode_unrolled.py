"""A small scanned model on one device is decoded in an unrolled form (`graph.split_model`): the same tokens
and calls as the model built unrolled, the copy made once per set of weights, a sharded or large model left
scanned. The per-row fields the host reads at a loop exit come back in one array (`state.pack_rows`)."""

import dataclasses

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from memllm_jax.bench.decode import DictMemory, build
from memllm_jax.decode import graph
from memllm_jax.decode import state as st
from memllm_jax.decode.reader import generate_with_memory

SHAPE = dict(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq_len=256)
MEMORY = DictMemory({("Rome", "capital of", None): ["Italy"]})


def _scanned_and_unrolled():
    (scanned, tok), (unrolled, _) = build(SHAPE), build(dict(SHAPE, scan_layers=False))
    assert scanned.cfg.scan_layers and not unrolled.cfg.scan_layers
    return scanned, unrolled, tok


@pytest.mark.slow
def test_scanned_model_decodes_unrolled_with_the_same_tokens_and_calls():
    scanned, unrolled, tok = _scanned_and_unrolled()
    graphdef, params = graph.split_model(scanned)
    assert not graph.merge(graphdef, params).cfg.scan_layers
    prompts = [[tok.bos_id] + tok.encode("x" * i) for i in range(3)]
    runs = []
    for model in (scanned, unrolled):
        for reads in ("host", "in_loop"):
            res = generate_with_memory(model, tok, MEMORY, prompts, 48, batch_size=3, reads=reads)
            runs.append([(r.token_ids, [(c.query_text, c.result, c.reason) for c in r.calls]) for r in res])
    assert all(run == runs[0] for run in runs)
    assert any(calls for _, calls in runs[0])


@pytest.mark.slow
def test_unrolled_copy_stores_kernels_as_bf16_operands_with_the_same_tokens():
    """With `matmul_dtype="bfloat16"` the unrolled copy keeps its block kernels in bf16 (no conversion per step);
    the products, and so the tokens and calls, are those of the model whose kernels stay float32."""
    (scanned, tok), (unrolled, _) = (build(dict(SHAPE, matmul_dtype="bfloat16")),
                                     build(dict(SHAPE, matmul_dtype="bfloat16", scan_layers=False)))
    copy = graph.merge(*graph.split_model(scanned))
    assert copy.layers[0].mlp.up.kernel[...].dtype == jax.numpy.bfloat16
    assert scanned.layers.mlp.up.kernel[...].dtype == jax.numpy.float32  # the model itself is unchanged
    prompts = [[tok.bos_id] + tok.encode("x" * i) for i in range(3)]
    runs = [[(r.token_ids, [(c.query_text, c.result) for c in r.calls])
             for r in generate_with_memory(model, tok, MEMORY, prompts, 48, batch_size=3)] for model in (scanned, unrolled)]
    assert runs[0] == runs[1]


def test_unrolled_copy_is_made_once_per_set_of_weights():
    scanned, _, _ = _scanned_and_unrolled()
    first = graph.split_model(scanned)
    again = graph.split_model(scanned)
    assert again[0] is first[0] and again[1] is first[1]
    kernel = scanned.layers.mlp.up.kernel
    kernel[...] = kernel[...] + 1.0  # new weights: a new array
    graphdef, params = graph.split_model(scanned)
    assert params is not first[1]
    unrolled = graph.merge(graphdef, params)
    np.testing.assert_array_equal(np.asarray(unrolled.layers[1].mlp.up.kernel[...]), np.asarray(kernel[...][1]))


def test_sharded_or_large_scanned_models_stay_scanned(monkeypatch):
    scanned, _, _ = _scanned_and_unrolled()
    monkeypatch.setattr(graph, "UNROLL_MAX_BYTES", 0)
    assert graph.merge(*graph.split_model(scanned)).cfg.scan_layers
    monkeypatch.undo()
    two = NamedSharding(Mesh(np.array(jax.devices()[:2]), ("d",)), PartitionSpec())
    kernel = scanned.layers.mlp.up.kernel
    kernel[...] = jax.device_put(kernel[...], two)
    assert graph.merge(*graph.split_model(scanned)).cfg.scan_layers


def test_pack_rows_round_trip():
    B, C, F = 3, 5, 4
    rng = np.random.default_rng(0)
    ints = lambda *shape: rng.integers(0, 9, shape).astype(np.int32)  # noqa: E731
    bools = lambda: rng.integers(0, 2, B).astype(bool)  # noqa: E731

    @dataclasses.dataclass
    class Cache:
        lengths_B: np.ndarray

    for forced in (False, True):
        s = st.DecodeState(cache=Cache(ints(B)), logits_BxV=None, out_BxC=ints(B, C), n_out_B=ints(B),
                           status_B=ints(B), budget_B=ints(B), in_call_B=bools(), active_call_B=bools(),
                           ban_read_B=bools(), rng=None, forced_BxF=ints(B, F) if forced else None,
                           forced_pos_B=ints(B) if forced else None, forced_len_B=ints(B) if forced else None)
        view = st.HostRows.unpack(np.asarray(st.pack_rows(s)), forced=forced)
        for name in ("status_B", "budget_B", "n_out_B", "in_call_B", "active_call_B", "ban_read_B", "out_BxC",
                     "forced_pos_B", "forced_len_B"):
            want, got = getattr(s, name), getattr(view, name)
            assert (got is None) if want is None else (got.dtype == want.dtype and np.array_equal(got, want)), name
        np.testing.assert_array_equal(view.lengths_B, s.cache.lengths_B)
