"""Input pipeline: tokenized segments with an explicit loss mask, left truncation keeping the loss span,
padding with length buckets, packing, deterministic shuffling, per-process slices, resumable iterator."""

import json

import numpy as np
import pytest

from memllm_jax import protocol
from memllm_jax.train import data as D
from tests.support.train_fixtures import document_write_records, lm_records, make_tokenizer, write_jsonl, write_records


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


def alone_logits(model, seqs) -> list[np.ndarray]:
    """Each token sequence's logits when run alone: one padded batch in one compiled call (padding after the
    tokens of a causal model changes none of their logits)."""
    from flax import nnx

    L = max(map(len, seqs))
    ids_BxL, mask_BxL = np.zeros((len(seqs), L), np.int32), np.zeros((len(seqs), L), bool)
    for b, ids in enumerate(seqs):
        ids_BxL[b, :len(ids)], mask_BxL[b, :len(ids)] = ids, True
    positions_BxL = np.tile(np.arange(L, dtype=np.int32), (len(seqs), 1))
    logits_BxLxV = nnx.jit(lambda m, t, p, a: m(t, p, a)[0])(model, ids_BxL, positions_BxL, mask_BxL)
    return [np.asarray(logits_BxLxV[b, :len(ids)]) for b, ids in enumerate(seqs)]


def test_segments_to_ids_and_flags(tok):
    rec = write_records(1)[0]
    (ex,) = D.tokenize_records([("x:1", rec)], tok)
    prompt, call = (tok.encode(s["text"]) for s in rec["segments"])
    assert ex.ids.tolist() == [tok.bos_id, *prompt, *call, tok.eos_id]
    assert ex.loss.tolist() == [False] + [False] * len(prompt) + [True] * len(call) + [True]
    assert ex.ids[1 + len(prompt)] == tok.marker_id[protocol.MEM_WRITE]


def test_left_truncation_keeps_loss_span(tok, tmp_path):
    rec = {"segments": [{"text": "Ada Lovelace visited Paris. " * 20, "loss": False},
                        {"text": "({MEM_WRITE-->Ada>>r>>Paris})", "loss": True}], "eos": True}
    path = write_jsonl(tmp_path / "t.jsonl", [rec])
    (full,) = D.tokenize_records([("t", rec)], tok)
    n_loss = int(full.loss.sum())
    corpus = D.load_corpus([path], tok, seq_len=n_loss + 5)
    (ex,) = corpus.examples
    assert corpus.truncated == 1 and len(ex.ids) == n_loss + 6
    assert ex.ids[0] == tok.bos_id
    assert ex.ids[-(n_loss):].tolist() == full.ids[-n_loss:].tolist() and ex.loss.sum() == n_loss
    # a loss span that cannot fit is dropped, never cut
    short = {"segments": [{"text": "Ada", "loss": False}, {"text": "Rome", "loss": True}], "eos": True}
    mixed = D.load_corpus([path, write_jsonl(tmp_path / "ok.jsonl", [short])], tok, seq_len=n_loss - 2)
    assert mixed.dropped == 1 and [e.where for e in mixed.examples] == [str(tmp_path / "ok.jsonl") + ":1"]


def test_bad_records_name_file_line_and_field(tok, tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(write_records(1)[0]) + "\n" + json.dumps({"segments": [{"text": "a", "loss": "yes"}]}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: segments\[0\].loss"):
        D.load_corpus([str(p)], tok, 64)
    p.write_text("{not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: invalid JSON"):
        D.load_corpus([str(p)], tok, 64)


def test_pad_batches_use_smallest_bucket_and_mask(tok, tmp_path):
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", write_records(64))], tok, seq_len=128)
    planner = D.Planner(corpus, seq_len=128, global_batch=8, packing="pad", seed=0)
    for k in range(planner.batches_per_epoch):
        plan = planner.plan(k)
        need = max(len(corpus.examples[r[0][0]].ids) for r in plan.rows) - 1
        assert plan.length == min(b for b in planner.buckets if b >= need)
        b = D.materialize(plan, corpus, pad_id=tok.pad_id, micro_batches=2)
        assert b["inputs"].shape == (2, 4, plan.length)
        for m in range(2):
            for r in range(4):
                ex = corpus.examples[plan.rows[m * 4 + r][0][0]]
                n = len(ex.ids) - 1
                assert b["inputs"][m, r, :n].tolist() == ex.ids[:-1].tolist()
                assert b["targets"][m, r, :n].tolist() == ex.ids[1:].tolist()
                assert b["loss_mask"][m, r].tolist() == ex.loss[1:].tolist() + [False] * (plan.length - n)
                assert not b["attn_mask"][m, r, n:].any()
    # every example appears at most once per epoch; epochs are reshuffled deterministically
    seen = [r[0][0] for k in range(planner.batches_per_epoch) for r in planner.plan(k).rows]
    assert len(seen) == len(set(seen)) == planner.batches_per_epoch * 8
    again = D.Planner(corpus, seq_len=128, global_batch=8, packing="pad", seed=0)
    assert [again.plan(k) for k in range(10)] == [planner.plan(k) for k in range(10)]
    e0 = [planner.plan(k).rows for k in range(planner.batches_per_epoch)]
    e1 = [planner.plan(planner.batches_per_epoch + k).rows for k in range(planner.batches_per_epoch)]
    assert e0 != e1


def test_packing_fills_rows_with_the_token_stream(tok, tmp_path):
    corpus = D.load_corpus([write_jsonl(tmp_path / "lm.jsonl", lm_records(50))], tok, seq_len=32)
    planner = D.Planner(corpus, seq_len=32, global_batch=4, packing="pack", seed=1)
    order = np.random.default_rng([1, 0]).permutation(len(corpus.examples))
    stream = np.concatenate([corpus.examples[i].ids for i in order])
    b = D.materialize(planner.plan(0), corpus, pad_id=tok.pad_id, micro_batches=1)
    assert b["attn_mask"].all() and b["inputs"].shape == (1, 4, 32)
    for r in range(4):
        assert b["inputs"][0, r].tolist() == stream[r * 33 : r * 33 + 32].tolist()
        assert b["targets"][0, r].tolist() == stream[r * 33 + 1 : r * 33 + 33].tolist()


def test_process_slices_and_iterator_resume(tok, tmp_path):
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", write_records(40))], tok, seq_len=64)
    planner = D.Planner(corpus, seq_len=64, global_batch=8, packing="pad", seed=0)
    whole = D.materialize(planner.plan(3), corpus, pad_id=tok.pad_id, micro_batches=2)
    parts = [D.materialize(planner.plan(3), corpus, pad_id=tok.pad_id, micro_batches=2, process_index=p, process_count=2)
             for p in range(2)]
    for k in whole:
        assert np.array_equal(np.concatenate([p[k] for p in parts], axis=1), whole[k])
    it = D.make_iterator(planner, 12, pad_id=tok.pad_id, micro_batches=1)
    for _ in range(5):
        next(it)
    state = it.get_state()
    rest = [next(it)["inputs"] for _ in range(4)]
    it2 = D.make_iterator(planner, 12, pad_id=tok.pad_id, micro_batches=1)
    it2.set_state(json.loads(json.dumps(state)))
    assert all(np.array_equal(a, next(it2)["inputs"]) for a in rest)


def test_pack_examples_rows_hold_whole_examples_once(tok, tmp_path):
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", write_records(96))], tok, seq_len=128)
    planner = D.Planner(corpus, seq_len=128, global_batch=4, packing="pack_examples", seed=0, drop_last=False)
    seen = []
    for k in range(planner.batches_per_epoch):
        plan = planner.plan(k)
        assert plan.separate and plan.length == 128
        b = D.materialize(plan, corpus, pad_id=tok.pad_id, micro_batches=1)
        for r, pieces in enumerate(plan.rows):
            assert sum(stop - start - 1 for _, start, stop in pieces) <= 128
            for s, (i, start, stop) in enumerate(pieces, start=1):
                assert (start, stop) == (0, len(corpus.examples[i].ids))
                where = b["segment_ids"][0, r] == s
                ex = corpus.examples[i]
                assert b["inputs"][0, r][where].tolist() == ex.ids[:-1].tolist()
                assert b["targets"][0, r][where].tolist() == ex.ids[1:].tolist()
                assert b["loss_mask"][0, r][where].tolist() == ex.loss[1:].tolist()
                assert b["positions"][0, r][where].tolist() == list(range(len(ex.ids) - 1))
            seen += [i for i, _, _ in pieces]
        assert b["loss_mask"][0][b["segment_ids"][0] == 0].sum() == 0
    assert sorted(seen) == list(range(len(corpus.examples)))
    mean_fill = sum(len(e.ids) - 1 for e in corpus.examples) / (planner.batches_per_epoch * 4 * 128)
    assert mean_fill > 0.6  # far less padding than one example per row


@pytest.mark.slow
def test_packed_forward_equals_separate_forwards(tok, tmp_path):
    """Segment ids keep packed examples independent: logits equal those of each example run alone."""
    import dataclasses

    import jax.numpy as jnp
    from flax import nnx

    from memllm_jax.config import TINY
    from memllm_jax.model.decoder import Decoder

    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", write_records(12))], tok, seq_len=128)
    planner = D.Planner(corpus, seq_len=128, global_batch=2, packing="pack_examples", seed=0, drop_last=False)
    plan = planner.plan(0)
    b = D.materialize(plan, corpus, pad_id=tok.pad_id, micro_batches=1)
    model = Decoder(dataclasses.replace(TINY, vocab_size=max(TINY.vocab_size, tok.vocab_size)), rngs=nnx.Rngs(0))
    packed = nnx.jit(lambda m, t, p, a, seg: m(t, p, a, segment_ids_BxL=seg)[0])(
        model, b["inputs"][0], b["positions"][0], b["attn_mask"][0], b["segment_ids"][0])
    pieces = [(r, s, i) for r, row in enumerate(plan.rows) for s, (i, _, _) in enumerate(row, start=1)]
    assert len(pieces) >= 3 and len({r for r, _, _ in pieces}) == 2
    alone = alone_logits(model, [corpus.examples[i].ids[:-1] for _, _, i in pieces])
    for (r, s, _), want in zip(pieces, alone):
        got = packed[r][jnp.asarray(b["segment_ids"][0, r] == s)]
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)


def test_pack_prefixes_lays_out_each_example_once_as_trunk_or_branch(tok, tmp_path):
    """One document's examples share their pretext: each branch starts where it leaves its trunk (an earlier piece of
    its row, laid out whole), before its first loss target, and sees the trunk's tokens before that point; every
    example appears once per epoch, in fewer input slots than "pack_examples" needs."""
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", document_write_records(24))], tok, seq_len=256)
    planner = D.Planner(corpus, seq_len=256, global_batch=4, packing="pack_prefixes", seed=0, drop_last=False)
    seen, branches, slots = [], 0, 0
    for k in range(planner.batches_per_epoch):
        plan = planner.plan(k)
        b = D.materialize(plan, corpus, pad_id=tok.pad_id, micro_batches=1)
        for r, pieces in enumerate(plan.rows):
            assert sum(stop - start - 1 for _, start, stop in pieces) <= 256
            for s, ((i, start, stop), trunk) in enumerate(zip(pieces, plan.trunks[r]), start=1):
                ex = corpus.examples[i]
                where = b["segment_ids"][0, r] == s
                assert stop == len(ex.ids)
                assert b["inputs"][0, r][where].tolist() == ex.ids[start:-1].tolist()
                assert b["targets"][0, r][where].tolist() == ex.ids[start + 1:].tolist()
                assert b["loss_mask"][0, r][where].tolist() == ex.loss[start + 1:].tolist()
                assert b["positions"][0, r][where].tolist() == list(range(start, len(ex.ids) - 1))
                if trunk < 0:
                    assert start == 0 and not b["prefix_segment_ids"][0, r][where].any()
                    continue
                branches += 1
                t_i, t_start, _ = pieces[trunk]
                assert trunk < s - 1 and t_start == 0 and start >= D.MIN_SHARED_PREFIX
                assert ex.ids[:start].tolist() == corpus.examples[t_i].ids[:start].tolist()
                assert not ex.loss[: start + 1].any()  # every loss target is in the branch
                assert set(b["prefix_segment_ids"][0, r][where]) == {trunk + 1}
                assert set(b["prefix_lengths"][0, r][where]) == {start}
            seen += [i for i, _, _ in pieces]
            slots += sum(stop - start - 1 for _, start, stop in pieces)
    assert sorted(seen) == list(range(len(corpus.examples)))
    assert branches >= len(corpus.examples) // 3  # sentences 2-4 of a 5-sentence document share 16+ tokens
    assert sum(len(e.ids) - 1 for e in corpus.examples) > 1.3 * slots


@pytest.mark.slow
@pytest.mark.parametrize("query_block", [0, 16])
def test_prefix_packed_forward_equals_separate_forwards(tok, tmp_path, query_block):
    """A branch computes what its example computes alone at the same positions (with and without query blocks)."""
    import dataclasses

    import jax.numpy as jnp
    from flax import nnx

    from memllm_jax.config import TINY
    from memllm_jax.model.decoder import Decoder

    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", document_write_records(3))], tok, seq_len=256)
    planner = D.Planner(corpus, seq_len=256, global_batch=2, packing="pack_prefixes", seed=0, drop_last=False)
    cfg = dataclasses.replace(TINY, vocab_size=max(TINY.vocab_size, tok.vocab_size), attention_block=query_block)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    alone = alone_logits(model, [e.ids[:-1] for e in corpus.examples])
    forward = nnx.jit(lambda m, b: m(b["inputs"], b["positions"], b["attn_mask"], segment_ids_BxL=b["segment_ids"],
                                     prefix_segment_ids_BxL=b["prefix_segment_ids"],
                                     prefix_lengths_BxL=b["prefix_lengths"])[0])
    checked = 0
    for k in range(planner.batches_per_epoch):
        plan = planner.plan(k)
        b = {f: jnp.asarray(v[0]) for f, v in D.materialize(plan, corpus, pad_id=tok.pad_id, micro_batches=1).items()}
        packed = forward(model, b)
        for r, pieces in enumerate(plan.rows):
            for s, ((i, start, _), trunk) in enumerate(zip(pieces, plan.trunks[r]), start=1):
                got = packed[r][b["segment_ids"][r] == s]
                np.testing.assert_allclose(np.asarray(got), alone[i][start:], atol=1e-5)
                checked += trunk >= 0
    assert checked >= 4  # branches, beside their trunks


def test_long_documents_are_windowed_for_evaluation_and_kept_whole_for_packing(tok, tmp_path):
    long_doc = {"segments": [{"text": "Ada Lovelace visited Paris and wrote notes. " * 40, "loss": True}], "eos": True}
    path = write_jsonl(tmp_path / "lm.jsonl", [long_doc])
    whole = D.load_corpus([path], tok, seq_len=32, truncate=False)
    (ex,) = whole.examples
    assert len(ex.ids) > 100 and whole.dropped == 0
    windows = D.split_long(ex, 33)
    assert all(len(w.ids) <= 33 for w in windows)
    # every target is predicted exactly once across the windows
    assert sum(int(w.loss[1:].sum()) for w in windows) == int(ex.loss[1:].sum())
    assert np.concatenate([windows[0].ids] + [w.ids[1:] for w in windows[1:]]).tolist() == ex.ids.tolist()
    with pytest.raises(ValueError, match="no usable"):
        D.load_corpus([path], tok, seq_len=32)  # truncation cannot keep a whole-document loss span


@pytest.mark.parametrize("packing", ["pad", "pack", "pack_examples", "pack_prefixes"])
def test_head_positions_select_every_loss_token_once(tok, tmp_path, packing):
    """`head_groups`: each group of rows lists its loss positions; every process computes the same capacity
    (from the global batch), and the gathered targets are exactly the loss tokens' targets."""
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", write_records(60))], tok, seq_len=64)
    planner = D.Planner(corpus, seq_len=64, global_batch=8, packing=packing, seed=0)
    for k in range(3):
        plan = planner.plan(k)
        whole = D.materialize(plan, corpus, pad_id=tok.pad_id, micro_batches=2, head_groups=2)
        M, R, L = whole["loss_mask"].shape
        assert whole["head_index"].shape[:2] == (2, 2)
        flat_targets = whole["targets"].reshape(M, 2, -1)
        for m in range(M):
            for g in range(2):
                valid = whole["head_valid"][m, g]
                got = flat_targets[m, g][whole["head_index"][m, g][valid]]
                want = flat_targets[m, g][whole["loss_mask"].reshape(M, 2, -1)[m, g]]
                assert got.tolist() == want.tolist() and len(want) > 0
        assert whole["head_index"].shape[-1] % (R // 2 * L // 8) == 0  # capacity in eighths of a group
        parts = [D.materialize(plan, corpus, pad_id=tok.pad_id, micro_batches=2, process_index=p, process_count=2,
                               head_groups=2) for p in range(2)]
        for key in ("head_index", "head_valid"):
            assert np.array_equal(np.concatenate([p[key] for p in parts], axis=1), whole[key])


def test_run_head_capacities_give_every_step_one_shape_per_length(tok, tmp_path):
    """Per-batch head capacities differ from batch to batch (each a new step shape to compile); with the first
    epoch's largest per length as floors, every batch of a length has the same head shape, none smaller than it
    needs, and the loss tokens are still each selected once."""
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", write_records(200))], tok, seq_len=128)
    planner = D.Planner(corpus, seq_len=128, global_batch=4, packing="pack_examples", seed=0)
    n = planner.batches_per_epoch
    own = {D.head_capacity(planner.plan(k), corpus, 1, 2) for k in range(n)}
    floors = D.run_head_capacities(planner, 10 * n, micro_batches=1, groups=2)
    assert len(own) > 1 and floors == {128: max(own)}
    for k in range(n):
        b = D.materialize(planner.plan(k), corpus, pad_id=tok.pad_id, micro_batches=1, head_groups=2,
                          head_floors=floors)
        assert b["head_index"].shape == (1, 2, max(own))
        assert b["head_valid"].sum() == b["loss_mask"].sum()
