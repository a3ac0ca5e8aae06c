"""The read loop on the real decoder: cached greedy decoding equals the argmax of full forwards token for
token across pauses, prefilled answers and removed calls; a removed call leaves the cache and next-token
logits of a context in which it never happened; a scanned model's read loop generates the unrolled one's tokens."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax import protocol
from memllm_jax.config import TINY
from memllm_jax.decode.graph import split_model
from memllm_jax.decode.prefill import MAX_PREFILL, prefill
from memllm_jax.decode.reader import ReadController, encode_prompt
from tests.support.scripted import CharTokenizer
from memllm_jax.model.decoder import Decoder, init_cache

from test_decode_reader import FakeMemory

TOK = CharTokenizer(extra=("x>>", "r>>"))
OPEN, END, CLOSE = (TOK.marker_id[m] for m in (protocol.MEM_READ, protocol.READ_END, protocol.CALL_END))
ID = {c: TOK.encode(c)[0] for c in ("a", "b", "x>>", "r>>")}


class Biased(nnx.Module):
    """The real decoder plus a fixed bias on the next token given the current one, so that random weights
    still open read calls at known points (`a` or `b` -> `({MEM_READ(` -> `x>>` -> `r>>` -> `)-->`,
    `})` -> `b`). The bias is part of the model: cached and full forwards both include it."""

    def __init__(self, seed=0):
        self.cfg = TINY.__class__(**{**TINY.__dict__, "vocab_size": TOK.vocab_size})
        self.inner = Decoder(self.cfg, rngs=nnx.Rngs(seed))
        bias = np.zeros((TOK.vocab_size, TOK.vocab_size), np.float32)
        for a, b in ((ID["a"], OPEN), (ID["b"], OPEN), (OPEN, ID["x>>"]), (ID["x>>"], ID["r>>"]), (ID["r>>"], END),
                     (CLOSE, ID["b"])):
            bias[a, b] = 30.0
        self.bias = nnx.Variable(jnp.asarray(bias))

    def make_cache(self, batch, max_len):
        return init_cache(self.cfg, batch, max_len)

    def __call__(self, tokens_BxL, positions_BxL, attn_mask_BxL=None, cache=None, deterministic=True):
        logits, cache = self.inner(tokens_BxL, positions_BxL, attn_mask_BxL, cache=cache)
        return logits + self.bias[...][tokens_BxL], cache


MODEL = Biased()


@jax.jit
def _full_logits(tokens_1xL):
    L = tokens_1xL.shape[1]
    return MODEL(tokens_1xL, jnp.arange(L)[None])[0][0]


def full_logits(ids):
    padded = np.zeros((1, -(-len(ids) // 32) * 32), np.int32)
    padded[0, : len(ids)] = ids
    return np.asarray(_full_logits(jnp.asarray(padded)))[: len(ids)]


PROMPTS = ["hello a", "zz yy a", "the cat sat on the mat", "mm"]


@pytest.mark.slow
@pytest.mark.parametrize("facts", [{("x", "r", None): ["P"]}, {}], ids=["kept", "empty"])
def test_cached_greedy_equals_argmax_of_full_forwards(facts):
    mem = FakeMemory(facts)
    ctrl = ReadController(MODEL, TOK, mem, max_len=128, chunk=4, trace=True)
    results = ctrl.run([encode_prompt(TOK, p) for p in PROMPTS], 40, MODEL.make_cache)
    reasons = {c.reason for r in results for c in r.calls}
    assert ("new_call" in reasons and any(c.repeated for r in results for c in r.calls)) if facts else "empty" in reasons
    n_checked = 0
    for r, trace in zip(results, ctrl.traces):
        assert sum(k == "g" for k in r.token_kinds) <= len(trace) == r.n_generated
        for ctx, token, banned in trace:
            logits = full_logits(list(ctx))[-1].copy()
            if banned:  # a call was just removed at this point: reopening it is not allowed
                logits[OPEN] = -np.inf
            assert token == int(np.argmax(logits)), (r.text, len(ctx))
            n_checked += 1
    assert n_checked == sum(r.n_generated for r in results) > 100


def _check_state_matches_fresh_context(ctrl, results):
    s = ctrl.last_state
    graphdef, params = split_model(MODEL)
    for b, r in enumerate(results):
        ids = r.prompt_ids + r.token_ids
        n = int(s.cache.lengths_B[b])
        assert n == len(ids)
        cache, logits = prefill(graphdef, params, MODEL.make_cache(1, 128), jnp.zeros((1, TOK.vocab_size)), [ids])
        np.testing.assert_allclose(np.asarray(s.logits_BxV[b]), np.asarray(logits[0]), atol=1e-5)
        np.testing.assert_allclose(np.asarray(s.logits_BxV[b]), full_logits(ids)[-1], atol=1e-5)
        for got, ref in zip(s.cache.slot_major(), cache.slot_major()):
            np.testing.assert_allclose(np.asarray(got[:, b, :n]), np.asarray(ref[:, 0, :n]), atol=1e-5)


@pytest.mark.slow
def test_removed_empty_call_leaves_the_context_without_it():
    ctrl = ReadController(MODEL, TOK, FakeMemory({}), max_len=128, chunk=4)
    # budget 4: ({MEM_READ( x>> r>> )--> ; the empty call is removed and generation ends right there
    results = ctrl.run([encode_prompt(TOK, p) for p in ("hello a", "zz yy a")], 4, MODEL.make_cache)
    for r in results:
        assert r.token_ids == [] and r.calls[0].reason == "empty"
    _check_state_matches_fresh_context(ctrl, results)


@pytest.mark.slow
def test_call_removed_by_a_new_call_leaves_the_context_without_it():
    ctrl = ReadController(MODEL, TOK, FakeMemory({("x", "r", None): ["P"]}), max_len=128, chunk=4)
    # budget 6: call, answer P}) prefilled, b, ({MEM_READ( -> the first call is removed, "b" re-fed
    results = ctrl.run([encode_prompt(TOK, p) for p in ("hello a", "zz yy a")], 6, MODEL.make_cache)
    for r in results:
        assert r.token_ids == [ID["b"], OPEN] and r.calls[0].reason == "new_call"
    _check_state_matches_fresh_context(ctrl, results)


@pytest.mark.slow
def test_long_prefill_in_pieces_equals_one_full_forward():
    ids = [TOK.bos_id] + TOK.encode("the quick brown fox jumps over the lazy dog " * 7)[:299]
    assert len(ids) > MAX_PREFILL
    graphdef, params = split_model(MODEL)
    cache, logits = prefill(graphdef, params, MODEL.make_cache(2, 512), jnp.zeros((2, TOK.vocab_size)), [ids, ids[:5]])
    assert cache.lengths_B.tolist() == [len(ids), 5]
    np.testing.assert_allclose(np.asarray(logits[0]), full_logits(ids)[-1], atol=1e-4)
    np.testing.assert_allclose(np.asarray(logits[1]), full_logits(ids[:5])[-1], atol=1e-5)


@pytest.mark.slow
def test_read_loop_of_a_scanned_model_generates_the_unrolled_tokens():
    unrolled, scanned = Biased(), Biased()
    scanned.cfg = dataclasses.replace(unrolled.cfg, scan_layers=True)
    scanned.inner = Decoder(scanned.cfg, rngs=nnx.Rngs(0))
    out = []
    for model in (unrolled, scanned):
        ctrl = ReadController(model, TOK, FakeMemory({("x", "r", None): ["P"]}), max_len=128, chunk=4)
        out.append([(r.token_ids, [c.reason for c in r.calls])
                    for r in ctrl.run([encode_prompt(TOK, p) for p in PROMPTS], 24, model.make_cache)])
    assert out[0] == out[1] and any(calls for _, calls in out[0])
