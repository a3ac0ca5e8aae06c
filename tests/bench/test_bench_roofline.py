"""FLOP counts of `bench.roofline`: by hand on a tiny config, against XLA's own count, and the write bench's
"of roofline" column (a smoke run; benches are never timed tests)."""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.bench import roofline as R
from memllm_jax.config import ModelConfig

HAND = ModelConfig(vocab_size=10, d_model=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, d_ff=16,
                   sliding_window=None)
# P = D(NH + 2KH) + NH.D + 3DF = 8 (8 + 8) + 8 x 8 + 3 x 8 x 16 = 576 -> 2P = 1152 per token;
# head 2DV = 160 per scored position; attention 4NH = 32 per (query, key) pair
BODY, HEAD, PAIR = 1152, 160, 32


def test_shapes_give_the_hand_counted_per_token_flops():
    assert (R.body_flops(HAND), R.head_flops(HAND), R.attention_flops(HAND, 1)) == (BODY, HEAD, PAIR)


def test_useful_write_flops_by_hand():
    prompts, generated = [[1, 2, 3], [1, 2, 4, 5]], [2, 1]
    # prefix trie: [1] [1 2] [1 2 3] [1 2 4] [1 2 4 5] -> positions 0 1 2 2 3, keys 1 + 2 + 3 + 3 + 4 = 13;
    # the head at each prompt's last token
    assert R.trie_positions(prompts) == [0, 1, 2, 2, 3]
    prefill = 5 * BODY + 13 * PAIR + 2 * HEAD
    # fed tokens: prompt 0 (3 tokens) attends 4 then 5 keys, prompt 1 (4 tokens) 5 keys
    decode = 3 * (BODY + HEAD) + (4 + 5 + 5) * PAIR
    assert R.useful_write_flops(HAND, prompts, generated) == R.WriteFlops(prefill, decode)


def test_executed_write_flops_by_hand():
    prompts, generated, stopped = [[1, 2, 3], [1, 2, 4, 5]], [2, 1], [True, False]
    got = R.executed_write_flops(HAND, prompts, generated, stopped, max_new_tokens=8, pad_to=4, share_prefixes=False)
    # 4 rows (2 padding); cache ceil((4 + 8 + 1) / 64) x 64 = 64 slots; prefill width bucket(4) = 8 tokens
    # attending 8 slots, the head at each row's last token; decode max(2 + 1 (stopped at a cut), 1) = 3 steps of 4
    # rows over 64 slots, K = 1
    prefill = 4 * 8 * BODY + 4 * HEAD + 4 * 8 * 8 * PAIR
    decode = 3 * (4 * (BODY + HEAD) + 1 * 4 * 64 * PAIR)
    assert got == R.WriteFlops(prefill, decode)


def test_executed_refill_flops_by_hand():
    prompts, generated, stopped = [[1, 2, 3], [1, 2, 4, 5], [7]], [2, 1, 3], [True, False, False]
    # steps 3, 1, 3; pool 2, refill at 1: prompts 0 and 1 run 1 step (prompt 1 stops), prompt 2 fills its row and
    # with nothing pending the loop runs 3 more steps
    assert R.refill_schedule([3, 1, 3], 2, 1) == [([0, 1], 1), ([2], 3)]
    got = R.executed_refill_flops(HAND, prompts, generated, stopped, pool=2, max_new_tokens=8, refill_at=1,
                                  share_prefixes=False)
    # cache 64 slots; fills of 2 rows and 1 row (`refill.fill_sizes`), 8 tokens wide attending 8 slots; 4 steps of
    # 2 rows
    prefill = 2 * 8 * BODY + 2 * HEAD + 2 * 8 * 8 * PAIR + 8 * BODY + HEAD + 8 * 8 * PAIR
    decode = 4 * (2 * (BODY + HEAD) + 2 * 64 * PAIR)
    assert got == R.WriteFlops(prefill, decode)


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_executed_is_at_least_useful(share, batch):
    rng = np.random.default_rng(batch)
    pretext = rng.integers(1, 50, 200).tolist()  # one document: prompts share their pretext
    prompts = [[0] + pretext[: 20 * i] + rng.integers(1, 50, 30).tolist() for i in range(10)]
    generated = rng.integers(0, 20, len(prompts)).tolist()
    stopped = (rng.random(len(prompts)) < 0.5).tolist()
    useful = R.useful_write_flops(HAND, prompts, generated)
    executed = R.executed_corpus_flops(HAND, prompts, generated, stopped, batch_size=batch, max_new_tokens=20,
                                       share_prefixes=share)
    assert executed.prefill >= useful.prefill and executed.decode >= useful.decode
    refilled = R.executed_refill_flops(HAND, prompts, generated, stopped, pool=batch, max_new_tokens=20,
                                       share_prefixes=share)
    assert refilled.prefill >= useful.prefill and refilled.decode >= useful.decode


# ------------------------------------------------------------------------------------------- against XLA

XLA_CFG = ModelConfig(vocab_size=96, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=192,
                      max_seq_len=256, sliding_window=None, scan_layers=False)
"""Unrolled: XLA's cost analysis counts a scanned layer loop's body once."""


def _xla_flops(fn, *args, **static) -> float:
    return float(jax.jit(fn, static_argnames=tuple(static)).lower(*args, **static).compile().cost_analysis()["flops"])


def _close(ours: float, xla: float) -> None:
    """XLA also counts the elementwise work (norms, RoPE, softmax, SiLU) we leave out: a few percent here."""
    assert ours <= xla <= 1.06 * ours, (ours, xla, xla / ours)


@pytest.fixture(scope="module")
def xla_model():
    from memllm_jax.model.decoder import Decoder

    return Decoder(XLA_CFG, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("rows, width, slots, attend", [(2, 32, 64, None), (3, 16, 32, 32)])
def test_prefill_call_flops_match_xla(xla_model, rows, width, slots, attend):
    from memllm_jax.decode import prefill
    from memllm_jax.decode.graph import cache_factory, split_model

    graphdef, params = split_model(xla_model)
    cache = cache_factory(xla_model)(rows, 64)
    xla = prefill._prefill.lower(graphdef, params, cache, jnp.zeros((rows, XLA_CFG.vocab_size)),
                                 jnp.zeros((rows, width), jnp.int32), jnp.full((rows,), width, jnp.int32),
                                 attend=attend).compile().cost_analysis()["flops"]
    _close(R.prefill_call_flops(XLA_CFG, rows, width, slots), float(xla))


def test_decode_step_flops_match_xla(xla_model):
    from memllm_jax.decode.graph import cache_factory, merge, split_model

    graphdef, params = split_model(xla_model)
    rows, slots = 4, 128
    cache = cache_factory(xla_model)(rows, slots)

    def step(params, cache, tok_B):
        return merge(graphdef, params)(tok_B[:, None], cache.lengths_B[:, None], jnp.ones((rows, 1), bool),
                                       cache=cache)[0]

    _close(R.decode_step_flops(XLA_CFG, rows, slots), _xla_flops(step, params, cache, jnp.zeros(rows, jnp.int32)))


def test_forward_flops_match_xla(xla_model):
    graphdef, params = nnx.split(xla_model)
    B, L = 2, 48
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))

    def forward(params, tokens):
        return nnx.merge(graphdef, params)(tokens, positions)[0]

    _close(R.forward_flops(XLA_CFG, B, L), _xla_flops(forward, params, jnp.zeros((B, L), jnp.int32)))


def test_train_step_flops_keep_their_shapes():
    """`bench.train.step_flops` counts with the shared shapes: forward 2NT + input grads 2NT, attention x 3."""
    from memllm_jax.bench.train import step_flops

    cfg = dataclasses.replace(HAND, n_layers=2)
    T, head = 2 * 5, 4
    want = 4.0 * (2 * 576 * T + 8 * 10 * head) + 3 * (4 * 2 * 8 * 2 * 5 * 5)  # 4 x layers x NH x B L^2
    assert step_flops(cfg, 2, (), 2, 5, head) == want


# ------------------------------------------------------------------------------------------- the bench


@pytest.mark.slow
def test_write_bench_reports_of_roofline(capsys):
    from memllm_jax.cli import main

    assert main(["bench", "decode", "--allow-load", "--part", "write", "--d-model", "32", "--layers", "1",
                 "--sentences", "8", "--batch", "4", "--repeats", "1", "--matmul-sizes", "64"]) == 0
    out = capsys.readouterr().out
    assert "refilled writes == sequential (tokens, and triples added): True" in out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert header[-2:] == ["of roofline", "executed / ceiling"] and len(rows) == 7
    assert any("refilled" in row[0] for row in rows)
    for row in rows:
        roof, executed = (float(re.fullmatch(r"([0-9.e+-]+)%", c).group(1)) / 100 for c in row[-2:])
        assert 0 < roof < 1.5 and roof <= executed, row
