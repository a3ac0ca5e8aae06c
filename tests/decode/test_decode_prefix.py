"""Shared-prefix prefill of memory-write batches: the plan, and on the real decoder the same cache and
next-token logits as prefilling every prompt whole; batched writes with sharing equal one sentence at a
time without it."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.bench.decode import build
from memllm_jax.config import TINY
from memllm_jax.decode.graph import split_model
from memllm_jax.decode.prefill import MIN_SAVED, plan_sharing, prefill, prefill_shared
from tests.support.scripted import CharTokenizer
from memllm_jax.decode.corpus_writer import iter_write_prompts, write_corpus, WriteDocument
from memllm_jax.decode.writer import WriteDecoding, decode_writes
from memllm_jax.model.decoder import Decoder, init_cache

TOK = CharTokenizer()
SENTS = [f"Person {i} was born in town {i * 7} in the year {1900 + i}." for i in range(6)]


def doc_prompts(doc_id="d", n=6, pretext=10):
    return [ids for _, ids in iter_write_prompts(WriteDocument.from_sentences(doc_id, SENTS[:n]), TOK, pretext)]


def test_plan_one_trunk_per_document_and_padding_untouched():
    a, b = doc_prompts("a"), doc_prompts("b", 3)
    b = [[TOK.bos_id] + TOK.encode("Other text. ") + p[1:] for p in b]  # another document: shares only BOS
    rows = a + b + [[TOK.bos_id]] * 2
    plan = plan_sharing(rows, n_active=len(a) + len(b))
    # trunks: each document's last (longest) prompt; its first, whose empty pretext shares nothing, is
    # prefilled whole in the second call (cheaper than one more padded trunk row)
    assert sorted(plan.trunks) == [len(a) - 1, len(a) + len(b) - 1]
    assert plan.shared[0] == 0 and plan.shared[len(a)] == 0
    for r in range(1, len(a) - 1):  # every other prompt takes its whole pretext from its document's trunk
        t = plan.trunks[plan.src[r]]
        assert t == len(a) - 1
        assert rows[r][: plan.shared[r]] == rows[t][: plan.shared[r]]
        assert len(rows[r]) - len(TOK.encode(SENTS[r])) - 4 <= plan.shared[r] < len(rows[r])
    assert plan.shared[-2:] == (0, 0) and plan.src[-2:] == (0, 0)
    assert plan.saved == sum(plan.shared[r] for r in range(len(rows)) if r not in plan.trunks)
    # a prompt that is a prefix of another keeps its last token to compute
    plan = plan_sharing([list(range(40)), list(range(30))])
    assert plan.trunks == (0,) and plan.shared[1] == 29
    # nothing shared: no trunks, one ordinary prefill
    plan = plan_sharing([[1] + [5] * 30, [1] + [6] * 30])
    assert plan.trunks == () and plan.saved == 0


@pytest.mark.slow
def test_shared_prefill_equals_whole_prefill_on_the_real_decoder():
    cfg = dataclasses.replace(TINY, vocab_size=TOK.vocab_size)
    model = Decoder(cfg, rngs=nnx.Rngs(3))
    g, p = split_model(model)
    other = [[TOK.bos_id] + TOK.encode("Other text. ") + p[1:] for p in doc_prompts("b", 3)]  # another document
    rows = doc_prompts("a", 5) + other + [[TOK.bos_id]]
    B, n_active, S = len(rows), len(rows) - 1, 448
    plan = plan_sharing(rows, n_active)
    assert plan.saved >= MIN_SAVED and len(plan.trunks) >= 2
    make = lambda b, s: init_cache(cfg, b, s)  # noqa: E731
    got, got_logits = prefill_shared(g, p, make, S, cfg.vocab_size, rows, n_active=n_active)
    want, want_logits = prefill(g, p, make(B, S), jnp.zeros((B, cfg.vocab_size)), rows[:n_active] + [[]])
    np.testing.assert_array_equal(np.asarray(got.lengths_B), [len(r) for r in rows[:n_active]] + [0])
    for b in range(n_active):
        n = len(rows[b])
        for name, got_LxBxSxKxH, want_LxBxSxKxH in zip("kv", got.slot_major(), want.slot_major()):
            np.testing.assert_allclose(np.asarray(got_LxBxSxKxH)[:, b, :n], np.asarray(want_LxBxSxKxH)[:, b, :n],
                                       atol=1e-5, err_msg=f"row {b} {name}")
            assert not np.asarray(got_LxBxSxKxH)[:, b, n:].any()  # slots past the row stay empty
    np.testing.assert_allclose(np.asarray(got_logits)[:n_active], np.asarray(want_logits)[:n_active], atol=1e-4)
    assert not np.asarray(got_logits)[n_active:].any()


@pytest.mark.slow
def test_batched_shared_writes_equal_one_sentence_at_a_time():
    model, tok = build(dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=128, max_seq_len=512))
    sents = [f"Ada was born in London in year {1800 + i}." for i in range(4)]
    docs = [WriteDocument.from_sentences(f"d{k}", sents[k:]) for k in range(2)]
    prompts = [ids for d in docs for _, ids in iter_write_prompts(d, tok)]
    assert plan_sharing(prompts).saved >= MIN_SAVED
    batched = decode_writes(model, tok, prompts, WriteDecoding(32), pad_to=16)
    one = [decode_writes(model, tok, [p], WriteDecoding(32), share_prefixes=False)[0] for p in prompts]
    assert [o["ids"] for o in batched] == [o["ids"] for o in one]
    assert all(o["cut"] >= 0 for o in batched) and {o["stop"] for o in batched} == {"late_stop"}
    np.testing.assert_allclose([o["score"] for o in batched], [o["score"] for o in one], atol=1e-4)

    class ListMemory:
        def __init__(self):
            self.added = []

        def add(self, triples, source):
            self.added += [(str(t), source) for t in triples]

    mems = [ListMemory(), ListMemory()]
    for mem, bs in zip(mems, (16, 1)):
        write_corpus(model, tok, mem, docs, WriteDecoding(32), batch_size=bs)
    assert mems[0].added == mems[1].added and mems[0].added
