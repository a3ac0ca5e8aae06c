"""Memory-read controller protocol paths, driven by a scripted model (exact token scripts)."""

import dataclasses

import pytest

from memllm_jax import protocol
from memllm_jax.decode.reader import generate_with_memory
from tests.support.scripted import CharTokenizer, PolicyModel

TOK = CharTokenizer()
EOS = TOK.eos_id


@dataclasses.dataclass
class Result:
    entities: list
    too_large: bool = False
    scores: list = dataclasses.field(default_factory=list)


class FakeMemory:
    """Answers from a dict; records every batched call."""

    def __init__(self, facts, q_thr=30):
        self.facts, self.q_thr, self.calls = facts, q_thr, []

    def query(self, queries):
        self.calls.append(list(queries))
        out = []
        for q in queries:
            ents = list(self.facts.get((q.subject, q.relation, q.object), []))
            out.append(Result([] if len(ents) > self.q_thr else ents, len(ents) > self.q_thr))
        return out


def scripted(*scripts):
    """A model that continues every script of which the generated text is a prefix, in script order."""
    encoded = [TOK.encode(s) + [EOS] for s in scripts]

    def policy(ctx):
        gen = ctx[ctx.index(TOK.bos_id) + 1 :]
        gen = gen[gen.index(PROMPT_END) + 1 :] if PROMPT_END in gen else gen
        prefs = [s[len(gen)] for s in encoded if s[: len(gen)] == gen and len(s) > len(gen)]
        return list(dict.fromkeys(prefs)) or [EOS]

    return PolicyModel(policy, TOK.vocab_size)


PROMPT_END = TOK.encode("|")[0]
PROMPT = "Q|"


def run(model, memory, prompts=(PROMPT,), **kw):
    kw.setdefault("max_new_tokens", 60)
    return generate_with_memory(model, TOK, memory, list(prompts), chunk=8, **kw)


def test_kept_result_is_prefilled_and_generation_continues():
    mem = FakeMemory({("x", "r", None): ["Paris"]})
    [res] = run(scripted("ab({MEM_READ(x>>r>>)-->Paris})cd"), mem)
    assert res.text == "ab({MEM_READ(x>>r>>)-->Paris})cd"
    assert res.plain_text == "abcd"
    assert res.finish_reason == "eos"
    [call] = res.calls
    assert call.queries == (protocol.Query("x", "r", None),) and call.result == ("Paris",) and not call.removed
    assert len(mem.calls) == 1


def test_empty_result_removes_call_and_bans_reopening():
    mem = FakeMemory({})
    [res] = run(scripted("ab({MEM_READ(x>>r>>)-->", "abcd"), mem)
    assert res.text == "abcd"
    [call] = res.calls
    assert call.removed and call.reason == "empty" and call.result == ()
    assert res.n_generated == len("ab") + 1 + len("x>>r>>") + 1 + len("cd") + 1


def test_empty_result_is_kept_closed_with_nothing_with_keep_empty():
    """Memory-aware reading: the memory's empty answer `})` is fed like any result and the model goes on after it;
    the same model without `keep_empty` has the call removed."""
    mem = FakeMemory({})
    model = scripted("ab({MEM_READ(q>>r>>)-->})cd", "abcd")
    [res] = run(model, mem, keep_empty=True)
    assert res.token_ids == TOK.encode("ab({MEM_READ(q>>r>>)-->})cd") + [EOS]
    assert res.token_kinds == "g" * len(TOK.encode("ab({MEM_READ(q>>r>>)-->")) + "a" + "ggg"
    assert res.plain_text == "abcd" and protocol.parse_read_result(res.text) == ()
    [call] = res.calls
    assert not call.removed and call.reason == "" and call.result == () and len(mem.calls) == 1
    [default] = run(model, FakeMemory({}))
    assert default.text == "abcd" and default.calls[0].reason == "empty"


def test_keep_empty_still_removes_too_large_and_malformed_calls():
    mem = FakeMemory({("z", "r", None): [f"e{i}" for i in range(31)]})
    for call, reason in (("z>>r>>", "too_large"), ("x>>r", "malformed")):
        [res] = run(scripted(f"ab({{MEM_READ({call})-->}})cd", "abcd"), mem, keep_empty=True)
        assert res.text == "abcd" and res.calls[0].removed and res.calls[0].reason == reason


def test_too_many_results_removes_call():
    mem = FakeMemory({("x", "r", None): [f"e{i}" for i in range(31)]})
    [res] = run(scripted("ab({MEM_READ(x>>r>>)-->", "abcd"), mem)
    assert res.text == "abcd"
    assert res.calls[0].removed and res.calls[0].reason == "too_large"


def test_q_thr_applies_to_merged_results():
    mem = FakeMemory({("x", "r", None): ["a", "b"], (None, "r", "y"): ["c"]})
    [res] = run(scripted("ab({MEM_READ(x>>r>>;>>r>>y)-->", "abcd"), mem, q_thr=2)
    assert res.calls[0].reason == "too_large" and res.text == "abcd"


def test_malformed_query_is_treated_as_empty_without_memory_call():
    mem = FakeMemory({("x", "r", None): ["Paris"]})
    [res] = run(scripted("ab({MEM_READ(x>>r)-->", "abcd"), mem)
    assert res.text == "abcd"
    assert res.calls[0].reason == "malformed" and res.calls[0].errors
    assert mem.calls == []


def test_new_call_removes_previous_and_repeated_query_is_not_rerun():
    mem = FakeMemory({("x", "r", None): ["P"]})
    model = scripted("a({MEM_READ(x>>r>>)-->P})b({MEM_READ(", "ab({MEM_READ(x>>r>>)-->P})c")
    [res] = run(model, mem)
    assert res.text == "ab({MEM_READ(x>>r>>)-->P})c"
    first, second = res.calls
    assert first.removed and first.reason == "new_call"
    assert second.repeated and not second.removed and second.result == ("P",)
    assert len(mem.calls) == 1


def test_call_cut_by_token_budget():
    mem = FakeMemory({("x", "r", None): ["P"]})
    [res] = run(scripted("ab({MEM_READ(xxxxxxxxxxxx>>r>>)-->"), mem, max_new_tokens=6)
    assert res.finish_reason == "budget" and len(res.token_ids) == 6
    [call] = res.calls
    assert not call.complete and call.reason == "truncated"
    assert res.plain_text == "ab" and mem.calls == []


def test_forced_read_and_gold_queries():
    mem = FakeMemory({("x", "r", None): ["P"]})
    model = scripted("({MEM_READ(x>>r>>)-->P})z")
    [gold] = run(model, mem, gold_queries=[[protocol.Query("x", "r", None)]])
    assert gold.text == "P})z" and gold.calls[0].result == ("P",)
    [forced] = run(model, mem, force_read=True)
    assert forced.text == "x>>r>>)-->P})z" and forced.calls[0].result == ("P",)


@pytest.mark.slow
def test_batch_rows_pause_independently_with_one_memory_call_per_round():
    mem = FakeMemory({("x", "r", None): ["Paris"], ("y", "r", None): ["Rome"]})
    scripts = ["ab({MEM_READ(x>>r>>)-->Paris})cd", "ac({MEM_READ(y>>r>>)-->Rome})e",
               "abcdefghijklmnopqrstuvwxyz", "ab({MEM_READ(z>>r>>)-->"]
    # Both reads close at the same step, so they share one batched memory call.
    single = [run(scripted(s), mem)[0].text for s in scripts[:3]]
    mem.calls.clear()
    batched = run(_BatchScripts(scripts), mem, prompts=["0|", "1|", "2|"])
    assert [r.text for r in batched] == single
    assert len(mem.calls) == 1 and len(mem.calls[0]) == 2


@pytest.mark.slow
def test_each_row_reads_its_own_memory():
    """One memory per prompt (e.g. one edit per question): the same query gets each row's own answer."""
    mems = [FakeMemory({("x", "r", None): ["Paris"]}), FakeMemory({("x", "r", None): ["Rome"]}), FakeMemory({})]
    scripts = ["({MEM_READ(x>>r>>)-->Paris})a", "({MEM_READ(x>>r>>)-->Rome})b", "({MEM_READ(x>>r>>)-->"]
    res = run(_BatchScripts(scripts), mems, prompts=["0|", "1|", "2|"])
    assert [r.calls[0].result for r in res] == [("Paris",), ("Rome",), ()]
    assert [r.text for r in res[:2]] == ["({MEM_READ(x>>r>>)-->Paris})a", "({MEM_READ(x>>r>>)-->Rome})b"]
    assert res[2].calls[0].removed and [len(m.calls) for m in mems] == [1, 1, 1]
    with pytest.raises(ValueError, match="2 memories for 3 prompts"):
        run(_BatchScripts(scripts), mems[:2], prompts=["0|", "1|", "2|"])


def _BatchScripts(scripts):
    encoded = [TOK.encode(s) + [EOS] for s in scripts]
    digits = {TOK.encode(str(i))[0]: i for i in range(len(scripts))}

    def policy(ctx):
        if len(ctx) < 3:
            return [EOS]
        script = encoded[digits[ctx[1]]]
        gen = ctx[3:]
        return [script[len(gen)]] if script[: len(gen)] == gen and len(script) > len(gen) else [EOS]

    return PolicyModel(policy, TOK.vocab_size)


def test_marker_strings_in_prompt_never_trigger_memory():
    mem = FakeMemory({("x", "r", None): ["P"]})
    text = "say ({MEM_READ(x>>r>>)--> and })|"
    model = scripted("ok")
    [res] = run(model, mem, prompts=[text])
    assert not set(res.prompt_ids) & set(TOK.marker_id.values())
    assert res.calls == [] and mem.calls == [] and res.text == "ok"


@pytest.mark.slow
def test_sampling_through_the_controller_is_reproducible_per_seed():
    from memllm_jax.decode.sampling import SamplingConfig

    letters = TOK.encode("abcdefgh")

    def policy(ctx):  # a near-uniform choice among eight letters at every step
        return letters if len(ctx) < 12 else [EOS]

    model = PolicyModel(policy, TOK.vocab_size)
    cfg = SamplingConfig(temperature=20.0)
    runs = [run(model, FakeMemory({}), max_new_tokens=8, sampling=cfg, seed=s)[0].text for s in (0, 0, 1)]
    assert runs[0] == runs[1] and runs[0] != runs[2] and len(runs[0]) == 8


def test_merge_results_takes_no_entities_from_a_too_large_query():
    """A call's results: entities in first-seen order, none from a query that matched too many; too large when one
    did or the call's entities exceed q_thr (generation then removes the call, Table 2 keeps the rest)."""
    from types import SimpleNamespace as R

    from memllm_jax.decode.calls import merge_results

    results = [R(entities=["a", "b"], too_large=False), R(entities=["x"], too_large=True),
               R(entities=["b", "c"], too_large=False)]
    assert merge_results(results) == (("a", "b", "c"), True)
    assert merge_results(results[::2]) == (("a", "b", "c"), False)
    assert merge_results(results[::2], q_thr=2) == (("a", "b", "c"), True)
