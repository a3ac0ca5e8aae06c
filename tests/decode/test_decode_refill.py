"""Refilled memory-write decoding (`decode.refill`): a pool that takes the next prompt as its rows stop gives
every prompt the result `decode_writes` gives it (random logits with and without late stopping, item bans,
documents sharing their pretext on the real decoder, stacked and per-layer caches), `write_corpus(refill=True)`
adds the triples of `refill=False` in the same order, and the loop calls are those `bench.roofline` counts."""

import dataclasses

import numpy as np
import pytest
from flax import nnx

from memllm_jax import protocol
from memllm_jax.bench import roofline as R
from memllm_jax.config import TINY
from memllm_jax.decode.item_bans import ban_spec
from memllm_jax.decode.graph import split_model
from memllm_jax.decode.prefill import MIN_SAVED, plan_sharing
from memllm_jax.decode.refill import default_refill_at, refill_writes
from tests.support.scripted import CharTokenizer, PolicyModel, TableModel
from memllm_jax.decode.corpus_writer import iter_write_prompts, write_corpus, WriteDocument
from memllm_jax.decode.writer import WriteDecoding, decode_writes
from memllm_jax.model.decoder import Decoder

POOL = 4


class SmallTok:
    bos_id, eos_id, pad_id, vocab_size = 1, 2, 0, 12
    marker_id = {protocol.CALL_END: 3, protocol.MEM_WRITE: 4}

    def decode(self, ids):
        return " ".join(map(str, ids))


def in_batches(model, tok, prompts, decoding, **kw):
    """Today's path: consecutive batches of POOL prompts."""
    return [o for s in range(0, len(prompts), POOL)
            for o in decode_writes(model, tok, prompts[s:s + POOL], decoding, pad_to=POOL, **kw)]


def steps(outs):
    """Loop steps each call ran: its fed tokens, plus the step that stopped it at a cut."""
    return [o["n_generated"] + (o["stop"] == "late_stop") for o in outs]


@pytest.mark.slow
@pytest.mark.parametrize("refill_at", [None, 1, POOL])
@pytest.mark.parametrize("late", [True, False])
def test_refilled_writes_equal_fixed_batches_on_random_logits(late, refill_at):
    rng = np.random.default_rng(7)
    table = rng.normal(size=(96, 12, 12)).astype(np.float32)
    table[:, :, 3] += 1.0  # the closing token is often the top choice
    table[:, :, 2] -= 1.3  # EOS now and then
    model = TableModel(table)
    prompts = [[1] + rng.integers(5, 12, size=n).tolist() + [4] for n in rng.integers(0, 30, size=6 * POOL)]
    dec, kw = WriteDecoding(40, late_stopping=late), dict(make_cache=model.make_cache)
    want = in_batches(model, SmallTok(), prompts, dec, **kw)
    assert len(set(steps(want))) > 5  # calls of many lengths: rows stop at different steps
    trace = []
    got = refill_writes(model, SmallTok(), prompts, dec, pool=POOL, refill_at=refill_at, trace=trace, **kw)
    assert got == want
    # rows were refilled while others ran, at the points `bench.roofline` counts
    at = default_refill_at(POOL) if refill_at is None else refill_at
    assert trace == R.refill_schedule(steps(want), POOL, at)
    assert sum(len(new) for new, _ in trace) == len(prompts)
    assert len(trace) > len(prompts) // POOL or at == POOL  # refill_at = the pool: fixed batches again


# ------------------------------------------------------------------------------------------- item bans

BTOK = CharTokenizer(extra=[">>"])
MEM_WRITE, CLOSE = BTOK.marker_id[protocol.MEM_WRITE], BTOK.marker_id[protocol.CALL_END]


def looping_writer(ctx: list[int]) -> list[int]:
    """The prompt `... S:<subjects>` names the subjects; at an item start the writer prefers them in order (then the
    closing token) and writes `s>>r>>s;`: without bans it writes the first subject again and again."""
    if MEM_WRITE not in ctx:
        return [0]
    at = ctx.index(MEM_WRITE)
    subjects = BTOK.decode(ctx[:at]).split("S:")[-1]
    fields = BTOK.decode(ctx[at + 1:]).split(";")[-1].split(">>")
    if fields == [""]:
        return BTOK.encode(subjects) + [CLOSE]
    if len(fields) < 3:
        return BTOK.encode(">>" if fields[-1] else "r")
    return BTOK.encode(";" if fields[2] else fields[0])


@pytest.mark.slow
@pytest.mark.parametrize("late", [False, True])
def test_refilled_writes_with_item_bans_equal_fixed_batches(late):
    model = PolicyModel(looping_writer, BTOK.vocab_size)
    prompts = [BTOK.encode(f"Text {i}. S:{'abcdefg'[:n]}") + [MEM_WRITE]
               for i, n in enumerate([1, 5, 2, 4, 3, 1, 6, 2, 3, 1])]
    dec = WriteDecoding(48, late_stopping=late, bans=ban_spec(BTOK, 4))
    kw = dict(make_cache=model.make_cache, share_prefixes=False)
    want = in_batches(model, BTOK, prompts, dec, **kw)
    stops = {o["stop"] for o in want}
    assert "repeat" in stops and len(stops) == 2  # some rows ran out of bans, the others closed
    assert len(set(steps(want))) > 3
    assert refill_writes(model, BTOK, prompts, dec, pool=POOL, refill_at=1, **kw) == want


# ------------------------------------------------------------------------------------------- the real decoder

TOK = CharTokenizer()
SENTS = [f"P{i} was born in T{i * 7} in {1900 + i}." for i in range(6)]


def random_writer(scan_layers: bool):
    """A random TINY decoder whose LM head favours the closing token and EOS, so calls end at many lengths."""
    cfg = dataclasses.replace(TINY, vocab_size=TOK.vocab_size, scan_layers=scan_layers)
    model = Decoder(cfg, rngs=nnx.Rngs(3))
    kernel = np.array(model.lm_head.kernel[...])
    kernel[:, CLOSE] *= 2.0
    kernel[:, TOK.eos_id] *= 2.0
    model.lm_head.kernel[...] = kernel
    return model


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_refilled_writes_of_documents_sharing_their_pretext_on_the_real_decoder(scan_layers):
    """Unrolled: the loop carries per-layer cache buffers (split_model); scanned and split as is: one stacked
    cache. New prompts of one document share their pretext in the refill's prefill."""
    model = random_writer(scan_layers)
    split = split_model(model) if not scan_layers else nnx.split(model)
    docs = [WriteDocument.from_sentences(f"d{k}", [f"Document {k} is about people born in towns."] + SENTS[k:k + 4])
            for k in range(3)]
    prompts = [ids for d in docs for _, ids in iter_write_prompts(d, TOK)]
    assert plan_sharing(prompts[:POOL]).saved >= MIN_SAVED  # the first fill shares
    dec, kw = WriteDecoding(24, late_stopping=False), dict(split=split)
    want = in_batches(model, TOK, prompts, dec, **kw)
    assert len(set(steps(want))) > 4
    trace = []
    got = refill_writes(model, TOK, prompts, dec, pool=POOL, refill_at=1, trace=trace, **kw)
    assert len(trace) > 2 * len(prompts) // POOL
    exact = ("ids", "text", "cut", "n_cuts", "n_generated", "stop")
    assert [{k: o[k] for k in exact} for o in got] == [{k: o[k] for k in exact} for o in want]
    for g, w in zip(got, want):  # floats up to rounding (other batch shapes)
        np.testing.assert_allclose(g["logps"], w["logps"], atol=1e-4)
        np.testing.assert_allclose(g["score"], w["score"], atol=1e-4)


# ------------------------------------------------------------------------------------------- write_corpus


def counting_writer(ctx: list[int]) -> list[int]:
    """A sentence `... has N facts.` gets a call of N items `eJ>>r>>oN;`, then the closing token."""
    if MEM_WRITE not in ctx:
        return [TOK.eos_id]
    at = ctx.index(MEM_WRITE)
    n = int([c for c in TOK.decode(ctx[:at]) if c.isdigit()][-1])
    body = TOK.decode(ctx[at + 1:])
    script = "".join(f"e{j}>>r>>o{n};" for j in range(n))
    return TOK.encode(script[len(body)]) if len(body) < len(script) else [CLOSE]


class ListMemory:
    def __init__(self):
        self.added = []

    def add(self, triples, source):
        self.added += [(str(t), source) for t in triples]


@pytest.mark.slow
def test_write_corpus_with_refill_adds_the_same_triples_in_the_same_order():
    model = PolicyModel(counting_writer, TOK.vocab_size)
    counts = [3, 0, 7, 1, 5, 2, 9, 4, 1, 6, 0, 8, 2, 3]
    docs = [(f"d{k}", [f"Item {k} has {n} facts." for n in counts[k:k + 3]]) for k in range(0, len(counts), 3)]
    docs.insert(2, ("empty", []))
    runs = {}
    for refill in (False, True):
        mem, reported = ListMemory(), []
        stats = write_corpus(model, TOK, mem, docs, WriteDecoding(96, late_stopping=False), batch_size=POOL,
                             make_cache=model.make_cache, refill=refill,
                             on_batch=lambda s, done, seen=reported: seen.append(list(done)))
        runs[refill] = mem.added, stats, reported
    (added, stats, reported), (added_r, stats_r, reported_r) = runs[False], runs[True]
    assert added_r == added and len(added) == sum(counts)
    assert stats_r == stats and stats.documents == len(docs)
    # every document reported exactly once (the empty one as soon as it was read); more reports than batches
    assert sorted(d for done in reported_r for d in done) == sorted(d for d, _ in docs)
    assert len(reported_r) > len(reported)
