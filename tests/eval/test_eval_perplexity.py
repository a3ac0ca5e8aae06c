"""Batched Table 2 evaluation against a direct token-by-token computation with the same model."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from memllm_jax import protocol
from memllm_jax.config import TINY
from memllm_jax.eval.mixture import char_spans_to_token_mask
from memllm_jax.eval.perplexity import ReadSetting, evaluate_perplexity
from memllm_jax.eval.records import EvalDoc, GoldRead, doc_from_record, encode_document
from memllm_jax.model.decoder import Decoder
from tests.support.eval_fakes import CharTokenizer

CFG = dataclasses.replace(TINY, vocab_size=128, max_seq_len=256)


def _docs():
    t1 = "Ann was born in Paris. Ann works at Acme."
    t2 = "Bob lives in Rome."
    q = protocol.Query
    d1 = EvalDoc("d1", t1, ((0, 3), (16, 21), (23, 26), (36, 40)),
                 (GoldRead(16, (q("Ann", "place of birth", None),), ("Paris",), ((16, 21),)),
                  GoldRead(36, (q("Ann", "employer", None),), ("Acme",), ((36, 40),))), ())
    d2 = EvalDoc("d2", t2, ((0, 3), (13, 17)), (GoldRead(13, (q("Bob", "residence", None),), ("Rome",), ((13, 17),)),), ())
    return [d1, d2]


@nnx.jit
def _last_logp(model, tokens, n):
    logits, _ = model(tokens, jax.numpy.arange(tokens.shape[1])[None])
    return jax.nn.log_softmax(logits[0, n - 1])


def _logp(model, seq):
    """log p(next | seq), one unpadded sequence at a time (padded to 128 only for compile reuse; causal)."""
    tokens = np.zeros((1, 128), np.int32)
    tokens[0, :len(seq)] = seq
    return np.asarray(_last_logp(model, jax.numpy.asarray(tokens), len(seq)), np.float64)


@pytest.mark.slow
def test_gold_reads_match_direct_computation():
    tok = CharTokenizer()
    model = Decoder(CFG, rngs=nnx.Rngs(0))
    docs = [encode_document(tok, d) for d in _docs()]
    setting = ReadSetting(positions="gold", queries="gold", results="gold_only")
    res = evaluate_perplexity(model, tok, docs, None, setting, batch_size=2)
    mr = tok.marker_id[protocol.MEM_READ]
    nll = {"overall": 0.0, "target": 0.0, "entity": 0.0}
    count = dict.fromkeys(nll, 0)
    for e in docs:
        ids = e.ids
        reads = {p: tok.encode(protocol.format_read_call(g.queries)) + tok.encode(protocol.format_read_result(list(g.targets)))
                 for p, g in zip(e.read_tokens, e.doc.reads)}
        for j in range(len(ids)):
            before = [p for p in reads if p < j]
            if before:
                p = max(before)
                ctx = [tok.bos_id] + ids[:p] + reads[p] + ids[p:j]
            else:
                ctx = [tok.bos_id] + ids[:j]
            lp = _logp(model, ctx)
            if j in reads:
                lp_read = _logp(model, [tok.bos_id] + ids[:j] + reads[j])[ids[j]]
                pm = np.exp(lp[mr])
                logp = np.log(np.exp(lp_read) * pm + np.exp(lp[ids[j]]) * (1 - pm))
            else:
                logp = lp[ids[j]]
            for k in nll:
                if e.masks[k][j]:
                    nll[k] -= logp
                    count[k] += 1
    for k in nll:
        assert res.ppl[k] == pytest.approx(np.exp(nll[k] / count[k]), rel=1e-4), k
    assert res.stats["reads"] == 3 and res.stats["target_in_results"] == 3


@pytest.mark.slow
def test_no_reads_is_plain_perplexity_and_reads_change_it():
    tok = CharTokenizer()
    model = Decoder(CFG, rngs=nnx.Rngs(1))
    docs = [encode_document(tok, d) for d in _docs()]
    res = evaluate_perplexity(model, tok, docs, None, ReadSetting(positions="none"), batch_size=4)
    nll, n = 0.0, 0
    for e in docs:
        for j in range(len(e.ids)):
            nll -= _logp(model, [tok.bos_id] + e.ids[:j])[e.ids[j]]
            n += 1
    assert res.ppl["overall"] == pytest.approx(np.exp(nll / n), rel=1e-4)
    assert res.stats["reads"] == 0
    gold = evaluate_perplexity(model, tok, docs, None, ReadSetting("gold", "gold", "gold_only"), batch_size=4)
    assert gold.ppl["target"] != pytest.approx(res.ppl["target"], rel=1e-6)


def test_encoding_offsets_and_masks():
    tok = CharTokenizer()
    d = _docs()[0]
    e = encode_document(tok, d)
    assert tok.decode(e.ids) == d.text
    assert e.read_tokens == [16, 36]
    assert e.masks["target"].sum() == len("Paris") + len("Acme")
    assert e.masks["entity"].tolist() == char_spans_to_token_mask(e.offsets, d.entity_spans).tolist()
    # Marker-like text is escaped: offsets still point into the raw text.
    raw = "a ({b}) c"
    text = protocol.escape_text(raw)
    d2 = EvalDoc("x", text, ((len(text) - 1, len(text)),), (), ())
    e2 = encode_document(tok, d2)
    assert all(t not in tok.marker_id.values() for t in e2.ids)
    assert [e2.offsets[i] for i in np.nonzero(e2.masks["entity"])[0]] == [(len(text) - 1, len(text))]


def test_bad_record_names_the_field():
    with pytest.raises(ValueError, match=r"rec7.*reads\[0\]"):
        doc_from_record({"text": "x", "reads": [{"pos": 0}]}, "rec7")


def test_real_eval_records_from_data_gen():
    """Records built by data_gen from a synthetic document load, tokenize and align."""
    from data_gen import synthetic
    from data_gen.docred import parse_document
    from data_gen.eval_examples import eval_record
    raw = next(iter(synthetic.iter_synthetic(1, seed=3)))
    rec = eval_record(parse_document(raw, 0, synthetic.synthetic_rel_info(), "synthetic"))
    d = doc_from_record(rec, "synthetic")
    tok = CharTokenizer()
    e = encode_document(tok, d)
    assert e.masks["target"].sum() > 0 and e.masks["entity"].sum() >= e.masks["target"].sum()
    for r, t in zip(d.reads, e.read_tokens):
        assert e.offsets[t][0] == r.char_pos


@pytest.mark.slow
def test_model_chosen_reads_with_a_scripted_model():
    """A scripted model reads right before "Paris" and asks <Ann, place of birth, *>: rows with model
    positions and queries make exactly that read, answer it from the memory, and TARGET PPL drops."""
    from tests.support.eval_fakes import scripted_reader

    model, tok, docs, Memory = scripted_reader()
    plain = evaluate_perplexity(model, tok, docs, None, ReadSetting(positions="none"), batch_size=2)
    read = evaluate_perplexity(model, tok, docs, Memory(), ReadSetting(), batch_size=2, trace_docs=1)
    assert read.stats["reads"] == 1 and read.stats["reads_with_results"] == 1 and read.stats["target_in_results"] == 1
    assert read.ppl["target"] < plain.ppl["target"]
    # the read trace: the call, its query and result, and the token losses with and without the read
    (trace,) = read.traces
    assert "".join(trace["tokens"]) == "Ann was born in Paris."
    (event,) = trace["reads"]
    assert event["token"] == 16 and event["status"] == "used" and event["results"] == ["Paris"]
    assert event["call"] == "({MEM_READ(Ann>>place of birth>>)-->" and event["target_hit"]
    assert event["queries"] == ["<Ann, place of birth, *>"] and event["until"] == len(trace["tokens"])
    loss_with, loss_without = np.array(trace["loss_with"]), np.array(trace["loss_without"])
    assert np.allclose(loss_with[:16], loss_without[:16]) and loss_with[16] < loss_without[16]
    assert np.exp(loss_with[np.array(trace["target"])].mean()) == pytest.approx(read.ppl["target"], rel=1e-3)
    # Gold positions with model queries (row ⑥) make the same read.
    six = evaluate_perplexity(model, tok, docs, Memory(), ReadSetting("gold", "model", "memory"), batch_size=2)
    assert six.ppl["target"] == pytest.approx(read.ppl["target"], rel=1e-9)
    wide = evaluate_perplexity(model, tok, docs, Memory(), ReadSetting(), batch_size=2, query_batch=8, trace_docs=1)
    assert wide.ppl == read.ppl and wide.stats == read.stats and wide.traces == read.traces


@pytest.mark.slow
def test_windowed_continuations_give_the_scores_of_whole_ones():
    """Model-chosen reads scored a few tokens at a time (the forward doubled until the next read is covered)
    make the same reads and give the same perplexities and traces as forwards to the document's end."""
    from tests.support.eval_fakes import scripted_reader

    text = "Ann was born in Paris. She worked in Rome and in Oslo, then went back to Paris in 1990."
    model, tok, docs, Memory = scripted_reader(text, read_at=(3, 16, 19, 33, 70))
    rounds: list[str] = []
    whole = evaluate_perplexity(model, tok, docs, Memory(), ReadSetting(window=0), batch_size=2, trace_docs=1)
    windowed = evaluate_perplexity(model, tok, docs, Memory(), ReadSetting(window=2), batch_size=2, trace_docs=1,
                                   progress=rounds.append)
    assert whole.stats == windowed.stats and whole.stats["reads"] == 5
    assert windowed.ppl == pytest.approx(whole.ppl, rel=1e-12) and windowed.traces == whole.traces
    assert any("scored further" in r for r in rounds)  # some reads needed longer forwards


@pytest.mark.slow
def test_kept_prefix_keys_values_give_the_whole_sequence_scores_and_generations():
    """Scoring / generating after a kept prefix equals doing it on the whole sequence."""
    from memllm_jax.eval.scoring import GreedyGenerator, Scorer

    model = Decoder(CFG, rngs=nnx.Rngs(3))
    rng = np.random.default_rng(0)
    docs = [list(rng.integers(9, 100, n)) for n in (40, 23, 57)]
    mr = 5
    scorer = Scorer(model, mr, batch_size=2)
    kept = scorer.score(docs, keep_kv=True)
    items = [(kept[0], 10, [mr, 11, 12, 13] + docs[0][10:20]), (kept[2], 31, [mr, 40] + docs[2][31:]),
             (kept[1], 22, [mr, 7])]
    fast = scorer.score_continuations(items)
    slow = scorer.score([d[:P] + c for (_, P, c), d in zip(items, (docs[0], docs[2], docs[1]))])
    with pytest.raises(ValueError, match="kept scores"):
        scorer.score_continuations([(kept[1], 23, [mr])])
    for f, s in zip(fast, slow):
        np.testing.assert_allclose(f.lp_next, s.lp_next, atol=1e-4)
        np.testing.assert_allclose(f.lp_mr, s.lp_mr, atol=1e-4)
        assert (f.argmax == s.argmax).mean() > 0.95  # ties aside
    gen = GreedyGenerator(model, batch_size=2)
    prefixes = [docs[0][:10] + [mr], docs[2][:31] + [mr], docs[1][:22] + [mr]]
    kv = [(kept[0].kv, 10), (kept[2].kv, 31), (kept[1].kv, 22)]
    assert gen.generate(prefixes, [2], 12, kept=kv) == gen.generate(prefixes, [2], 12)
    # Table 2 generates queries in more rows than it scores (`query_batch`): the same tokens
    assert GreedyGenerator(model, batch_size=4).generate(prefixes, [2], 12, kept=kv) == gen.generate(prefixes, [2], 12)


@pytest.mark.slow
def test_batches_by_length_pads_alike_and_results_keep_the_input_order():
    """Batches are formed shortest first (stable), and each result still belongs to its own input."""
    from memllm_jax.eval.scoring import GreedyGenerator, Scorer, batches_by_length

    assert batches_by_length([5, 1, 9, 1, 3], 2) == [[1, 3], [4, 0], [2]]
    assert batches_by_length([], 4) == []
    model = Decoder(CFG, rngs=nnx.Rngs(4))
    rng = np.random.default_rng(1)
    seqs = [list(rng.integers(9, 100, n)) for n in (50, 6, 31, 7, 44)]
    scorer = Scorer(model, 5, batch_size=2)
    together = scorer.score(seqs)
    for seq, got in zip(seqs, together):
        alone = scorer.score([seq])[0]
        assert len(got.lp_next) == len(seq) - 1
        np.testing.assert_allclose(got.lp_next, alone.lp_next, atol=1e-5)
    gen = GreedyGenerator(model, batch_size=2)
    assert gen.generate(seqs, [2], 5) == [gen.generate([s], [2], 5)[0] for s in seqs]


def test_scorer_and_generator_count_the_real_tokens_they_run():
    """`ModelWork`: positions, logits and attention pairs of the unpadded inputs, by hand."""
    from memllm_jax.eval.scoring import GreedyGenerator, Scorer

    model = Decoder(CFG, rngs=nnx.Rngs(5))
    scorer = Scorer(model, 5, batch_size=2)
    kept = scorer.score([[1, 9, 10], [1, 11, 12, 13, 14]], keep_kv=True)
    assert (scorer.work.positions, scorer.work.logits, scorer.work.attention_pairs) == (8, 8, 6 + 15)
    scorer.score_continuations([(kept[1], 2, [5, 20, 21])])  # 3 tokens after 2 cached: 3 + 4 + 5 keys
    assert (scorer.work.positions, scorer.work.attention_pairs) == (11, 21 + 12)
    gen = GreedyGenerator(model, batch_size=2)
    out = gen.generate([[1, 9, 10], [1, 11, 12, 13, 14]], [], 4, kept=[(kept[0].kv, 2), (kept[1].kv, 5)])
    assert [len(o) for o in out] == [4, 4] and gen.work.decoded == 8
    # prefill: 1 token after 2 kept (3 keys), none after 5; then 4 fed tokens per row at positions 3.. / 5..
    assert gen.work.positions == 1 + 8 and gen.work.logits == 1 + 8
    assert gen.work.attention_pairs == 3 + (4 + 5 + 6 + 7) + (6 + 7 + 8 + 9)


def test_a_shared_scorer_runs_the_plain_forward_once_and_scores_alike():
    """Rows sharing one Scorer (Table 2's, the scaling points'): the kept plain forward of the same documents is
    returned again, not recomputed or counted, and every row's figures equal those of a Scorer of its own."""
    from memllm_jax.eval.scoring import Scorer

    tok = CharTokenizer()
    model = Decoder(CFG, rngs=nnx.Rngs(6))
    docs = [encode_document(tok, d) for d in _docs()]
    scorer = Scorer(model, tok.marker_id[protocol.MEM_READ], batch_size=2, pad_id=tok.pad_id)
    seqs = [[tok.bos_id] + e.ids for e in docs]
    first = scorer.score(seqs, keep_kv=True)
    positions = scorer.work.positions
    assert scorer.score(seqs, keep_kv=True) is first and scorer.work.positions == positions
    assert scorer.score(seqs[:1], keep_kv=True) is not first and scorer.work.positions > positions
    plain = sum(len(s) for s in seqs)
    # the first row runs the plain forward of both documents again (the last kept one was of the first alone)
    for setting, saved in ((ReadSetting(positions="none"), 0), (ReadSetting("gold", "gold", "gold_only"), plain)):
        shared = evaluate_perplexity(model, tok, docs, None, setting, batch_size=2, scorer=scorer)
        alone = evaluate_perplexity(model, tok, docs, None, setting, batch_size=2)
        assert shared.ppl == alone.ppl and shared.stats == alone.stats
        assert alone.work.positions - shared.work.positions == saved
