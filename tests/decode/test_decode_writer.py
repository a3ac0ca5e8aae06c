"""Memory writes: late stopping against a brute-force reading of Appendix A, corpus writing with
provenance, and marker strings inside documents."""

import numpy as np
import pytest

from memllm_jax import protocol
from tests.support.scripted import CharTokenizer, PolicyModel, TableModel
from memllm_jax.decode.corpus_writer import write_corpus
from memllm_jax.decode.writer import WriteDecoding, decode_writes, item_confidences

TOK = CharTokenizer()
CLOSE = TOK.marker_id[protocol.CALL_END]


def reference(table, prompt, close, eos, patience, max_new, late=True):
    """Appendix A, step by step: greedy; a top-1 closing token records a cut point (average log-prob of
    the body plus the closing token) and the runner-up is taken; stop after `patience` cut points in a
    row that do not improve on the best; cut at the best."""
    P = table.shape[0]
    ctx, body, lps = list(prompt), [], []
    best, best_pos, no_improve = -np.inf, -1, 0
    while True:
        logits = table[min(len(ctx) - 1, P - 1), ctx[-1]].astype(np.float64)
        logp = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        order = np.argsort(-logits)
        if order[0] == close:
            score = (sum(lps) + logp[close]) / (len(lps) + 1)
            if score > best:
                best, best_pos, no_improve = score, len(body), 0
            else:
                no_improve += 1
            if not late or no_improve >= patience:
                break
            t = int(order[1])
        else:
            t = int(order[0])
        body.append(t)
        lps.append(logp[t])
        ctx.append(t)
        if t == eos or len(body) >= max_new:
            break
    n = best_pos if best_pos >= 0 else len(body)
    return body[:n], best_pos, best, lps[:n]


class SmallTok:
    bos_id, eos_id, pad_id, vocab_size = 1, 2, 0, 12
    marker_id = {protocol.CALL_END: 3, protocol.MEM_WRITE: 4}

    def decode(self, ids):
        return " ".join(map(str, ids))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("late", [True, False])
def test_late_stopping_matches_brute_force_on_random_logits(seed, late):
    rng = np.random.default_rng(seed)
    V, P = SmallTok.vocab_size, 96
    table = rng.normal(size=(P, V, V)).astype(np.float32)
    table[:, :, 3] += 1.2  # the closing token is often, not always, the top choice
    table[:, :, 2] -= 1.0  # EOS now and then
    prompts = [[1] + rng.integers(5, V, size=n).tolist() + [4] for n in (3, 7, 1, 12, 5, 9)]
    outs = decode_writes(TableModel(table), SmallTok(), prompts, WriteDecoding(40, late_stopping=late),
                         make_cache=TableModel(table).make_cache)
    n_cuts = 0
    for prompt, out in zip(prompts, outs):
        body, cut, best, lps = reference(table, prompt, 3, 2, 5, 40, late)
        assert out["ids"] == body and out["cut"] == cut
        np.testing.assert_allclose(out["logps"], lps, atol=1e-5)  # each written token's log-probability
        if cut >= 0:
            assert out["score"] == pytest.approx(best, abs=1e-5)
        n_cuts += out["n_cuts"]
    # late: the rule was exercised past the first cut; greedy: one cut at most per row
    assert n_cuts > 2 * len(prompts) if late else n_cuts <= len(prompts)


class RecordingMemory:
    def __init__(self):
        self.added = []

    def add(self, triples, source="", replace=False):
        self.added.append((list(triples), source))
        return list(range(len(triples)))


def write_policy(ctx):
    """After `({MEM_WRITE-->`: `a>>r>>b`, then `})` over `;`, then `c>>r>>d`, then `})` over `;`, ..."""
    start = ctx.index(TOK.marker_id[protocol.MEM_WRITE]) + 1 if TOK.marker_id[protocol.MEM_WRITE] in ctx else None
    if start is None:
        return [TOK.eos_id]
    body = TOK.decode(ctx[start:])
    item = body.split(";")[-1]
    target = "a>>r>>b" if body.count(";") == 0 else "c>>r>>d"
    if item == target:
        return [CLOSE] + TOK.encode(";")
    if target.startswith(item):
        return TOK.encode(target[len(item)])
    return [TOK.eos_id]


def test_write_corpus_cuts_at_best_point_and_records_provenance():
    mem = RecordingMemory()
    docs = [("d1", ["First sentence.", "Second one."]), ("d2", ["Only ({MEM_WRITE--> x>>y>>z}) here."])]
    seen = []
    stats = write_corpus(PolicyModel(write_policy, TOK.vocab_size), TOK, mem, docs, WriteDecoding(48), batch_size=2,
                         make_cache=PolicyModel(write_policy, TOK.vocab_size).make_cache,
                         on_batch=lambda s, done: seen.extend(done))
    assert stats.sentences == 3 and stats.documents == 2 and stats.no_cut == 0
    assert mem.added == [([protocol.Triple("a", "r", "b")], "d1/0"), ([protocol.Triple("a", "r", "b")], "d1/1"),
                         ([protocol.Triple("a", "r", "b")], "d2/0")]
    assert seen == ["d1", "d2"]
    # late stopping went on past the first cut: 1 improving cut + 5 without improvement
    assert stats.tokens > 6 * len("a>>r>>b")


def endless_policy(ctx):
    """After `({MEM_WRITE-->`: `a>>r>>b;c>>r>>d;a>>r>>b;...`, never a closing token."""
    if TOK.marker_id[protocol.MEM_WRITE] not in ctx:
        return [TOK.eos_id]
    body = TOK.decode(ctx[ctx.index(TOK.marker_id[protocol.MEM_WRITE]) + 1:])
    return TOK.encode(("a>>r>>b;c>>r>>d;" * 8)[len(body)])


def test_call_cut_by_the_budget_writes_its_closed_items_only():
    mem = RecordingMemory()
    model = PolicyModel(endless_policy, TOK.vocab_size)
    stats = write_corpus(model, TOK, mem, [("d1", ["A sentence."])], WriteDecoding(12, late_stopping=False),
                         batch_size=1, make_cache=model.make_cache)
    # 12 tokens: `a>>r>>b;c>>r` - the unfinished `c>>r` is dropped, not written as a triple
    assert stats.no_cut == 1 and stats.malformed == 0
    assert mem.added == [([protocol.Triple("a", "r", "b")], "d1/0")]


def test_marker_strings_in_documents_never_form_markers():
    from memllm_jax.decode.corpus_writer import iter_write_prompts, WriteDocument

    doc = WriteDocument.from_sentences("d", ["a ({MEM_READ(x>>r>>)--> b", "c }) ({USER_ST}) d"])
    for _, ids in iter_write_prompts(doc, TOK):
        markers = [t for t in ids if t in TOK.marker_id.values()]
        assert markers == [TOK.marker_id[m] for m in (protocol.USER_ST, protocol.USER_END, protocol.MEM_WRITE)]


def test_is_grounded_needs_copied_names_and_a_known_relation():
    from memllm_jax.decode.corpus_writer import is_grounded

    context, sentence = "Ada Lovelace was born in London. She married  William King.", "She married  William King."
    t = protocol.Triple
    assert is_grounded(t("ada lovelace", "spouse", "William   King"), context, sentence, {"spouse"})
    assert not is_grounded(t("Ada Lovelace", "spouse", "William Kingsley"), context, sentence, None)  # not copied
    assert not is_grounded(t("Ada Lovelace", "place of birth", "London"), context, sentence, None)  # not this sentence
    assert not is_grounded(t("Ada Lovelace", "married to", "William King"), context, sentence, {"spouse"})
    assert is_grounded(t("Ada Lovelace", "married to", "William King"), context, sentence, None)
    assert not is_grounded(t("Ada", "spouse", "Will"), context, sentence, None)  # whole words only
    assert not is_grounded(t("William King", "spouse", "william  king"), context, sentence, None)  # itself
    mentor = "Ada Lovelace's mentor was  William King."  # a relation outside the labels, named by the sentence
    assert is_grounded(t("Ada Lovelace", "Mentor", "William King"), context + mentor, mentor, {"spouse"}, True)
    assert not is_grounded(t("Ada Lovelace", "mentor", "William King"), context + mentor, mentor, {"spouse"})
    assert not is_grounded(t("Ada Lovelace", "teacher", "William King"), context + mentor, mentor, {"spouse"}, True)
    assert not is_grounded(t("Ada Lovelace", "ment", "William King"), context + mentor, mentor, {"spouse"}, True)


def test_grounded_write_corpus_drops_names_not_in_the_text():
    """The scripted model writes `a>>r>>b` after every sentence: grounded, it survives only where both `a` and `b`
    occur in the document so far and one of them in the focus sentence; the dropped triples are counted."""
    model = PolicyModel(write_policy, TOK.vocab_size)
    docs = [("d1", ["a met b.", "Then a left.", "Nothing here."]), ("d2", ["Only b."])]
    for relations, kept in ((None, ["d1/0", "d1/1"]), ({"r"}, ["d1/0", "d1/1"]), ({"s"}, [])):
        mem = RecordingMemory()
        stats = write_corpus(model, TOK, mem, docs, WriteDecoding(48), batch_size=2, make_cache=model.make_cache,
                             grounded=True, relations=relations)
        assert [src for _, src in mem.added] == kept
        assert stats.ungrounded == [protocol.Triple("a", "r", "b")] * (4 - len(kept))
        assert stats.sentences == 4
        assert [(src, fate) for src, _, fate in stats.written] == [
            (src, "kept" if src in kept else "ungrounded") for src in ("d1/0", "d1/1", "d1/2", "d2/0")]


def test_item_confidence_is_the_weakest_token_of_the_item_and_its_opening_separator():
    tok = CharTokenizer(extra=["b;c"])  # one token spans the end of item 0, the separator and item 1's start
    body = tok.encode("a>>r>>b;c>>r>>d;e>>r>>f;broken")
    assert tok.decode(body[6:7]) == "b;c" and tok.decode(body[13:14]) == ";" and len(body) == 28
    logps = [-0.1] * len(body)
    logps[3] = -2.0  # inside item 0 ("r")
    logps[6] = -1.0  # "b;c": counts for items 0 and 1
    logps[13] = -3.0  # ";" opening item 2
    conf = item_confidences(tok, body, logps)
    assert conf == {protocol.Triple("a", "r", "b"): -2.0, protocol.Triple("c", "r", "d"): -1.0,
                    protocol.Triple("e", "r", "f"): -3.0}  # "broken" does not parse: left out
    twice = tok.encode("a>>r>>b;a>>r>>b")
    assert item_confidences(tok, twice, [-0.5] * 7 + [-0.2] * 8) == {protocol.Triple("a", "r", "b"): -0.2}
    assert item_confidences(tok, [], []) == {}


def unsure_policy(ctx):
    """After `({MEM_WRITE-->`: `a>>r>>b;c>>r>>d})`, hesitating between `d` and `e` (two choices one logit apart)."""
    if TOK.marker_id[protocol.MEM_WRITE] not in ctx:
        return [TOK.eos_id]
    body = TOK.decode(ctx[ctx.index(TOK.marker_id[protocol.MEM_WRITE]) + 1:])
    target = "a>>r>>b;c>>r>>d"
    if body == target:
        return [CLOSE]
    nxt = TOK.encode(target[len(body)])
    return nxt + TOK.encode("e") if target[len(body)] == "d" else nxt


def test_min_confidence_drops_the_items_the_model_hesitated_on():
    model = PolicyModel(unsure_policy, TOK.vocab_size)
    for min_confidence, kept in ((None, ["a", "c"]), (-0.5, ["a", "c"]), (-0.1, ["a"])):
        mem = RecordingMemory()
        stats = write_corpus(model, TOK, mem, [("d1", ["a met b."])], WriteDecoding(32, late_stopping=False),
                             batch_size=1, make_cache=model.make_cache, min_confidence=min_confidence)
        assert [t.subject for t in mem.added[0][0]] == kept
        assert [t.subject for t in stats.unconfident] == [s for s in "ac" if s not in kept]


def test_scored_writes_fill_a_memory_as_a_write_at_that_threshold_would():
    """`WriteStats.scored` keeps each checked triple with its confidence; `write_scored` at a threshold adds
    exactly what `write_corpus` at that threshold adds, sentence by sentence."""
    from memllm_jax.decode.corpus_writer import write_scored

    model = PolicyModel(unsure_policy, TOK.vocab_size)
    docs = [("d1", ["a met b.", "Then c."]), ("d2", ["a met b."])]
    write = lambda mem, mc: write_corpus(model, TOK, mem, docs, WriteDecoding(32, late_stopping=False),  # noqa: E731
                                         batch_size=2, make_cache=model.make_cache, min_confidence=mc)
    everything = write(RecordingMemory(), -float("inf"))
    assert [(src, t.subject) for src, t, _ in everything.scored] == [
        ("d1/0", "a"), ("d1/0", "c"), ("d1/1", "a"), ("d1/1", "c"), ("d2/0", "a"), ("d2/0", "c")]
    confidence = {t.subject: c for _, t, c in everything.scored}
    assert confidence["a"] > -0.1 > confidence["c"] > -0.5  # the model hesitated on `d`
    for threshold in (-0.5, -0.1, 0.0):
        direct, replayed = RecordingMemory(), RecordingMemory()
        write(direct, threshold)
        assert write_scored(replayed, everything.scored, threshold) == sum(len(t) for t, _ in direct.added)
        assert replayed.added == direct.added


def test_the_development_threshold_is_the_one_with_the_highest_f1():
    """Hand-made: at -1.0 three triples are written (two right: F1 0.8), at -0.6 two (one right: 0.5), at -0.3
    one (right: 0.67), at -0.1 none; a triple written twice counts from its most confident write. Equal F1
    goes to the higher threshold."""
    from memllm_jax.eval.write_quality import choose_min_confidence

    T = protocol.Triple
    gold = [T("a", "r", "b"), T("c", "r", "d")]
    scored = [(T("a", "r", "b"), -0.2), (T("x", "r", "y"), -0.5), (T("c", "r", "d"), -0.8), (T("a", "r", "b"), -0.9)]
    threshold, rows = choose_min_confidence(scored, gold, (-0.1, -0.3, -0.6, -1.0))
    assert threshold == -1.0
    assert [round(r["f1"], 3) for r in rows] == [0.8, 0.5, 0.667, 0.0]
    assert [r["written_unique"] for r in rows] == [3, 2, 1, 0]
    assert choose_min_confidence(scored, gold, (-1.0, -0.9))[0] == -0.9  # the same three triples
    # None keeps every triple: chosen only when no threshold does better
    threshold, rows = choose_min_confidence(scored, gold, (-0.1, -0.3, None))
    assert threshold is None and [(r["min_confidence"], round(r["f1"], 3)) for r in rows] == [
        (None, 0.8), (-0.3, 0.667), (-0.1, 0.0)]
    assert choose_min_confidence(scored, gold, (-0.6, -1.0, None))[0] == -1.0  # equal F1: the higher threshold


def test_edits_are_written_with_the_memory_stages_checks():
    """Table 3's edits (`eval.editing.extract_edits`) go through the same checks as the memory stage's writes,
    with the edit statement as the document and the focus sentence."""
    from memllm_jax.eval.editing import EditRecord, extract_edits

    model = PolicyModel(unsure_policy, TOK.vocab_size)
    recs = [EditRecord("a met", "a saw", "b", "x", statement="a met b and c, not d.")]
    write = lambda **checks: extract_edits(model, TOK, recs, WriteDecoding(32, late_stopping=False),  # noqa: E731
                                           batch_size=1, **checks)
    ab, cd = protocol.Triple("a", "r", "b"), protocol.Triple("c", "r", "d")
    assert write() == [[ab, cd]]
    assert write(grounded=True, relations={"r"}) == [[ab, cd]]
    assert write(grounded=True, relations={"s"}) == [[]]  # unknown relation
    assert write(min_confidence=-0.1) == [[ab]]  # the model hesitated on `d`


FIELD_TOK = CharTokenizer(extra=[">>"])
"""`>>` as one token, as repeated-item bans need."""


def test_decoding_settings_the_loop_cannot_use_are_refused_by_name():
    """`WriteDecoding` refuses empty budgets and patience, `write_decoding` negative bans; each message
    starts with the setting's name, which the CLI and the pipeline turn into their own option's name."""
    from memllm_jax.decode.writer import write_decoding, write_spec

    for bad, start in ((dict(max_new_tokens=0), "max_new_tokens 0:"), (dict(patience=0), "patience 0:")):
        with pytest.raises(ValueError) as err:
            WriteDecoding(**bad)
        assert str(err.value).startswith(start)
    with pytest.raises(ValueError, match="^ban_repeats -1: must be 0"):
        write_decoding(TOK, ban_repeats=-1)
    with pytest.raises(ValueError, match="^ban_repeats 3: repeated-item bans need '>>' to be one token"):
        write_decoding(TOK, ban_repeats=3)  # this tokenizer spells `>>` in two tokens
    decoding = write_decoding(FIELD_TOK, ban_repeats=3, max_new_tokens=20, late_stopping=False)
    assert decoding.bans.max_bans == 3
    spec = write_spec(FIELD_TOK, decoding, max_len=64)  # the loop's settings: every decoding field, and the token ids
    assert (spec.max_new_tokens, spec.late_stopping, spec.bans, spec.max_len) == (
        20, False, decoding.bans, 64) and spec.close_id == FIELD_TOK.marker_id[protocol.CALL_END]


def test_the_pipeline_writes_its_memory_and_its_edits_with_one_decoding(monkeypatch):
    """The memory stage's decoding comes from the config's `write` settings; Table 3's edits take the same with an
    edit's budget; a refused setting names the config field."""
    import dataclasses
    import types

    from experiments import stages
    from experiments.pipeline_config import PipelineConfig
    from memllm_jax.errors import InputError
    from memllm_jax.eval.editing import EDIT_WRITE_TOKENS
    from memllm_jax.settings import replace

    monkeypatch.setattr(stages, "_labels", lambda self: {"P1": "r"})
    cfg = replace(PipelineConfig(), {"write.grounded": True, "write.late_stopping": False, "write.max_new_tokens": 48,
                                     "write.ban_repeats": 4, "write.min_confidence": None})
    pipe = types.SimpleNamespace(cfg=cfg, tokenizer=lambda: FIELD_TOK)
    budget = stages._write_budget(pipe, -1.0)
    assert budget["decoding"] == WriteDecoding(48, late_stopping=False, bans=budget["decoding"].bans)
    assert budget["decoding"].bans.max_bans == 4 and budget["relations"] == {"r"} and budget["min_confidence"] == -1.0
    edits = stages._edit_checks(pipe)
    assert edits == {"write_decoding": dataclasses.replace(budget["decoding"], max_new_tokens=EDIT_WRITE_TOKENS)}
    pipe.cfg = replace(cfg, {"write.max_new_tokens": 0})
    with pytest.raises(InputError, match="^setting write.max_new_tokens 0: must be at least 1"):
        stages._write_budget(pipe, None)
