"""Prefill of rows of very different lengths in groups of similar length (`decode.prefill.prefill_calls`): the plan
covers every non-empty row once at less padded work, and on the real decoder the cache and next-token logits equal
prefilling each row alone."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import TINY
from memllm_jax.decode.graph import split_model
from memllm_jax.decode.prefill import CALL_COST_TOKENS, MIN_GROUP, prefill, prefill_calls
from memllm_jax.decode.shapes import bucket
from memllm_jax.model.decoder import Decoder, init_cache


def _cost(calls, B):
    return sum((B if c.rows is None else len(c.rows)) * c.width + CALL_COST_TOKENS for c in calls)


def test_rows_of_different_lengths_go_in_groups():
    B, max_len = 64, 320
    n = np.array([35 + (i * 37) % 95 for i in range(B - 4)] + [0] * 4, np.int32)  # 35..129 tokens, 4 empty rows
    calls = prefill_calls(np.zeros(B, np.int32), n, max_len)
    assert len(calls) > 1
    picked = np.concatenate([c.rows for c in calls])
    real = picked[picked < B]
    assert sorted(real) == sorted(np.flatnonzero(n))  # every non-empty row once, the empty ones in none
    assert (picked[picked >= B] == B).all()
    for c in calls:
        g = len(c.rows)
        assert g >= MIN_GROUP and g & (g - 1) == 0 and g < B
        rows = c.rows[c.rows < B]
        assert c.width == bucket(int(n[rows].max()), cap=max_len) and c.attend == c.width
    whole = bucket(int(n.max()), cap=max_len)
    assert _cost(calls, B) < B * whole + CALL_COST_TOKENS
    # few rows, or rows of one length: one call over every row, in place
    assert [c.rows for c in prefill_calls(np.zeros(4, np.int32), np.array([3, 40, 0, 9]), max_len)] == [None]
    assert [c.rows for c in prefill_calls(np.zeros(B, np.int32), np.full(B, 50), max_len)] == [None]
    # after cached tokens each group attends to the slots its own rows reach
    lengths = np.where(np.arange(B) < 8, 150, 0)
    for c in prefill_calls(lengths, n, max_len):
        rows = c.rows[c.rows < B]
        need = int((lengths[rows] + n[rows]).max())
        assert c.attend is None or c.attend >= need


@pytest.mark.slow
def test_grouped_prefill_equals_each_row_alone_on_the_real_decoder():
    cfg = dataclasses.replace(TINY, vocab_size=64)
    model = Decoder(cfg, rngs=nnx.Rngs(5))
    g, p = split_model(model)
    rng = np.random.default_rng(0)
    B, S, V = 20, 96, cfg.vocab_size
    first = [list(rng.integers(1, V, 3)) if b % 3 == 0 else [] for b in range(B)]  # some rows already hold tokens
    n = [0 if b >= 16 else int(rng.integers(2, 60)) for b in range(B)]  # rows 16-19 get nothing
    second = [list(rng.integers(1, V, k)) for k in n]
    cache, logits = prefill(g, p, init_cache(cfg, B, S), jnp.zeros((B, V)), first)
    calls = prefill_calls(np.asarray(cache.lengths_B), np.asarray(n, np.int32), S)
    assert len(calls) > 1 and all(c.rows is not None for c in calls)  # the grouped path is the one tested
    got, got_logits = prefill(g, p, cache, logits, second)
    k_got, v_got = (np.asarray(x) for x in got.slot_major())
    for b in range(B):
        alone, alone_logits = prefill(g, p, init_cache(cfg, 1, S), jnp.zeros((1, V)), [first[b] + second[b]])
        total = len(first[b]) + len(second[b])
        assert int(got.lengths_B[b]) == total
        np.testing.assert_allclose(np.asarray(got_logits[b]), np.asarray(alone_logits[0] if total else logits[b]),
                                   atol=1e-4, err_msg=f"row {b}")
        for got_kv, want_kv in zip((k_got, v_got), alone.slot_major()):
            np.testing.assert_allclose(got_kv[:, b, :total], np.asarray(want_kv)[:, 0, :total], atol=1e-4)
            assert not got_kv[:, b, total:].any()
