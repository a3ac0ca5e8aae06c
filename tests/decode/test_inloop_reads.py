"""Reads served inside the jitted loop (`reads="in_loop"`) give exactly the tokens, calls and memory queries of
the host path (`reads="host"`), on the scripted model of test_decode_reader."""

import dataclasses

import pytest

from memllm_jax import protocol
from memllm_jax.decode import reader
from memllm_jax.decode.reader import generate_with_memory
from tests.support.scripted import PolicyModel

from test_decode_reader import EOS, TOK, FakeMemory, scripted

FACTS = {("x", "r", None): ["Paris"], ("y", "r", None): ["Rome", "Oslo"], ("z", "r", None): [f"e{i}" for i in range(31)],
         (None, "r", "w"): ["Kyiv"]}


def _row_scripts(scripts):
    """A model whose row i (prompt `<letter i>|`) follows scripts[i]: 16+ rows, each on its own script."""
    encoded = [TOK.encode(s) + [EOS] for s in scripts]
    letters = {TOK.encode(chr(ord("A") + i))[0]: i for i in range(len(scripts))}

    def policy(ctx):
        if len(ctx) < 3:
            return [EOS]
        script, gen = encoded[letters[ctx[1]]], ctx[3:]
        return [script[len(gen)]] if script[: len(gen)] == gen and len(script) > len(gen) else [EOS]

    return PolicyModel(policy, TOK.vocab_size), [chr(ord("A") + i) + "|" for i in range(len(scripts))]


def _both(model, facts, prompts=("Q|",), **kw):
    """Run both paths with fresh memories; return (host results, in-loop results, host memory, in-loop memory)."""
    kw.setdefault("max_new_tokens", 60)
    kw.setdefault("chunk", 8)
    out = []
    for reads in ("host", "in_loop"):
        mem = [FakeMemory(f) for f in facts] if isinstance(facts, list) else FakeMemory(facts)
        out.append((generate_with_memory(model, TOK, mem, list(prompts), reads=reads, **kw), mem))
    (host, host_mem), (inloop, inloop_mem) = out
    return host, inloop, host_mem, inloop_mem


def _queries(mem):
    mems = mem if isinstance(mem, list) else [mem]
    return [sorted(str(q) for call in m.calls for q in call) for m in mems]


def _assert_same(host, inloop, host_mem, inloop_mem):
    assert [dataclasses.asdict(r) for r in inloop] == [dataclasses.asdict(r) for r in host]
    assert _queries(inloop_mem) == _queries(host_mem)


CASES = {
    "kept": ("ab({MEM_READ(x>>r>>)-->Paris})cd",),
    "empty": ("ab({MEM_READ(q>>r>>)-->", "abcd"),
    "too_large": ("ab({MEM_READ(z>>r>>)-->", "abcd"),
    "malformed": ("ab({MEM_READ(x>>r)-->", "abcd"),
    "new_call_and_repeat": ("a({MEM_READ(x>>r>>)-->Paris})b({MEM_READ(", "ab({MEM_READ(x>>r>>)-->Paris})c"),
    "two_entities_then_object_query": ("a({MEM_READ(y>>r>>)-->Rome;Oslo})b({MEM_READ(>>r>>w)-->Kyiv})c",),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_batch_1_matches_the_host_path(case):
    host, inloop, host_mem, inloop_mem = _both(scripted(*CASES[case]), FACTS)
    _assert_same(host, inloop, host_mem, inloop_mem)


@pytest.mark.slow
def test_concrete_tokens_of_a_kept_call_and_of_removed_calls():
    model = scripted("ab({MEM_READ(x>>r>>)-->Paris})cd")
    [res] = generate_with_memory(model, TOK, FakeMemory(FACTS), ["Q|"], 60, chunk=8, reads="in_loop")
    assert res.token_ids == TOK.encode("ab({MEM_READ(x>>r>>)-->Paris})cd") + [EOS]
    assert res.token_kinds == "g" * len(TOK.encode("ab({MEM_READ(x>>r>>)-->")) + "a" * 6 + "ggg"  # P a r i s })
    assert res.calls[0].result == ("Paris",) and res.finish_reason == "eos"
    for script in (CASES["empty"], CASES["too_large"], CASES["malformed"]):
        [res] = generate_with_memory(scripted(*script), TOK, FakeMemory(FACTS), ["Q|"], 60, chunk=8, reads="in_loop")
        assert res.text == "abcd" and res.calls[0].removed
    [res] = generate_with_memory(scripted(*CASES["new_call_and_repeat"]), TOK, FakeMemory(FACTS), ["Q|"], 60,
                                 chunk=8, reads="in_loop")
    assert res.text == "ab({MEM_READ(x>>r>>)-->Paris})c"
    assert [(c.reason, c.repeated) for c in res.calls] == [("new_call", False), ("", True)]


@pytest.mark.slow
def test_empty_read_kept_in_the_loop_as_on_the_host_path():
    """`keep_empty`: the in-loop path feeds the empty answer `})` as a forced token and keeps the call, with the
    host path's tokens; a kept empty call is removed like any other when the model opens a new one; the default
    removes it."""
    model = scripted("ab({MEM_READ(q>>r>>)-->})cd", "abcd")
    host, inloop, host_mem, inloop_mem = _both(model, FACTS, keep_empty=True)
    _assert_same(host, inloop, host_mem, inloop_mem)
    [res] = inloop
    assert res.token_ids == TOK.encode("ab({MEM_READ(q>>r>>)-->})cd") + [EOS]
    assert res.token_kinds == "g" * len(TOK.encode("ab({MEM_READ(q>>r>>)-->")) + "a" + "ggg"
    assert [(c.reason, c.result, c.removed) for c in res.calls] == [("", (), False)]
    [default] = generate_with_memory(model, TOK, FakeMemory(FACTS), ["Q|"], 60, chunk=8, reads="in_loop")
    assert default.text == "abcd" and default.calls[0].reason == "empty"
    reopen = scripted("a({MEM_READ(q>>r>>)-->})b({MEM_READ(", "ab({MEM_READ(x>>r>>)-->Paris})c")
    host, inloop, host_mem, inloop_mem = _both(reopen, FACTS, keep_empty=True)
    _assert_same(host, inloop, host_mem, inloop_mem)
    assert inloop[0].text == "ab({MEM_READ(x>>r>>)-->Paris})c"
    assert [(c.reason, c.result) for c in inloop[0].calls] == [("new_call", ()), ("", ("Paris",))]


BATCH = ["ab({MEM_READ(x>>r>>)-->Paris})cd", "ac({MEM_READ(y>>r>>)-->Rome;Oslo})e", "abcdefghijklmnopqrstuvwxyz",
         "ab({MEM_READ(q>>r>>)-->", "({MEM_READ(z>>r>>)-->", "xy({MEM_READ(x>>r)-->",
         "a({MEM_READ(x>>r>>)-->Paris})b({MEM_READ(x>>r>>)-->Paris})c", "({MEM_READ(>>r>>w)-->Kyiv})({MEM_READ(y>>r>>)-->",
         "ab({MEM_READ(x>>r>>)-->Paris})cd", "zz({MEM_READ(x>>r>>;>>r>>w)-->Paris;Kyiv})k", "({MEM_READ(xxxxxxxxxxxxxxxxx",
         "hello", "ab({MEM_READ(y>>r>>)-->Rome;Oslo})cd({MEM_READ(q>>r>>)-->", "({MEM_READ(", "m({MEM_READ(x>>r>>)-->",
         "a({MEM_READ(y>>r>>)-->Rome;Oslo})bbbbbbbbbbbbbbbbbbbb({MEM_READ(x>>r>>)-->Paris})c"]


@pytest.mark.parametrize("answer_width,host_callback", [(64, "auto"), (64, "io"), (3, "auto")],
                         ids=["in_loop", "in_loop_io_callback", "long_feeds_via_host"])
@pytest.mark.slow
def test_batch_16_matches_the_host_path(answer_width, host_callback):
    """Rows close calls at the same and at different steps; with a 3-token queue most answers and re-fed
    texts are prefilled by the host instead (HOST_FEED), with the same results. The loop calls the host by
    `buffer_callback` on CPU ("auto"), or by `io_callback` as on TPU."""
    model, prompts = _row_scripts(BATCH)
    ids = [reader.encode_prompt(TOK, p) for p in prompts]
    runs = {}
    for reads in ("host", "in_loop"):
        mem = FakeMemory(FACTS)
        ctrl = reader.ReadController(model, TOK, mem, max_len=128, chunk=8, reads=reads, answer_width=answer_width)
        ctrl.spec = dataclasses.replace(ctrl.spec, host_callback=host_callback)
        runs[reads] = (ctrl.run(ids, 48, model.make_cache), mem, ctrl.last_state.cache.lengths_B.tolist())
    (host, host_mem, host_len), (inloop, mem, inloop_len) = runs["host"], runs["in_loop"]
    _assert_same(host, inloop, host_mem, mem)
    assert inloop_len == host_len
    reasons = {c.reason for r in host for c in r.calls}
    assert {"", "empty", "too_large", "malformed", "new_call", "truncated"} <= reasons
    assert {r.finish_reason for r in host} == {"eos", "budget"}


@pytest.mark.slow
def test_reads_do_not_exit_the_loop(monkeypatch):
    """Five reads in one row, each new one removing the previous: the host path leaves the loop at every
    `)-->` and every reopening (9 exits, 10 chunks), the in-loop path runs one chunk."""
    call = "({MEM_READ(x>>r>>)-->Paris})"
    scripts = ["abcde"[:k] + call + "abcdef"[k] + ("({MEM_READ(" if k < 5 else "") for k in range(1, 6)]
    chunks = {}
    real = reader.read_chunk

    def counting(*args, **kw):
        chunks[mode] = chunks.get(mode, 0) + 1
        return real(*args, **kw)

    monkeypatch.setattr(reader, "read_chunk", counting)
    texts = {}
    for mode in ("host", "in_loop"):
        [res] = generate_with_memory(scripted(*scripts), TOK, FakeMemory(FACTS), ["Q|"], 200, chunk=128, reads=mode)
        texts[mode] = (res.text, [(c.reason, c.repeated) for c in res.calls])
    kept = ("abcde" + call + "f", [("new_call", False)] + [("new_call", True)] * 3 + [("", True)])
    assert texts["host"] == texts["in_loop"] == kept
    assert chunks == {"host": 10, "in_loop": 1}


def test_budget_ending_at_the_call_end_still_feeds_the_answer():
    """The budget ends with `)-->`: both paths put the answer in the context (and the cache)."""
    model = scripted("ab({MEM_READ(x>>r>>)-->Paris})cd")
    n = len(TOK.encode("ab({MEM_READ(x>>r>>)-->"))
    runs = {}
    for reads in ("host", "in_loop"):
        ctrl = reader.ReadController(model, TOK, FakeMemory(FACTS), max_len=64, chunk=8, reads=reads)
        [res] = ctrl.run([[TOK.bos_id] + TOK.encode("Q|")], n, model.make_cache)
        runs[reads] = (dataclasses.asdict(res), ctrl.last_state.cache.lengths_B.tolist())
    assert runs["host"] == runs["in_loop"]
    assert runs["host"][0]["text"].endswith("Paris})") and runs["host"][0]["finish_reason"] == "budget"


@pytest.mark.slow
def test_forced_read_gold_queries_and_per_row_memories_match():
    model = scripted("({MEM_READ(x>>r>>)-->Paris})z")
    for kw in ({"gold_queries": [[protocol.Query("x", "r", None)]]}, {"force_read": True}):
        _assert_same(*_both(model, FACTS, **kw))
    model, prompts = _row_scripts(["({MEM_READ(x>>r>>)-->Paris})a", "({MEM_READ(x>>r>>)-->Rome})b", "({MEM_READ(x>>r>>)-->"])
    facts = [{("x", "r", None): ["Paris"]}, {("x", "r", None): ["Rome"]}, {}]
    host, inloop, host_mem, inloop_mem = _both(model, facts, prompts)
    _assert_same(host, inloop, host_mem, inloop_mem)
    assert [r.calls[0].result for r in inloop] == [("Paris",), ("Rome",), ()]


def test_an_unknown_host_callback_is_refused():
    ctrl = reader.ReadController(scripted("a"), TOK, FakeMemory({}), max_len=64, chunk=8, reads="in_loop")
    ctrl.spec = dataclasses.replace(ctrl.spec, host_callback="grpc")
    with pytest.raises(ValueError, match="host_callback"):
        ctrl.run([[TOK.bos_id] + TOK.encode("Q|")], 4, scripted("a").make_cache)


def test_a_failing_memory_raises_after_the_loop_instead_of_inside_it():
    class Broken:
        def query(self, queries):
            raise RuntimeError("memory offline")

    with pytest.raises(RuntimeError, match="memory offline"):
        generate_with_memory(scripted(CASES["kept"][0]), TOK, Broken(), ["Q|"], 60, chunk=8, reads="in_loop")
    with pytest.raises(ValueError, match="reads="):
        generate_with_memory(scripted("a"), TOK, FakeMemory({}), ["Q|"], 4, reads="device")


@pytest.mark.slow
@pytest.mark.parametrize("host_callback", ["auto", "io"], ids=["buffer_callback", "io_callback"])
@pytest.mark.parametrize("facts", [{("x", "r", None): ["P"]}, {}], ids=["kept", "empty"])
def test_real_decoder_matches_host_path_and_rewinds_the_cache_exactly(facts, host_callback):
    """On the real decoder (test_decode_parity's biased Mistral): same tokens and calls as the host path, and
    after in-loop answers and removals the cache and next-token logits equal a fresh prefill of the context."""
    from test_decode_parity import MODEL, PROMPTS, TOK as PTOK, _check_state_matches_fresh_context

    ids = [reader.encode_prompt(PTOK, p) for p in PROMPTS]
    runs = {}
    for reads in ("host", "in_loop"):
        ctrl = reader.ReadController(MODEL, PTOK, FakeMemory(facts), max_len=128, chunk=4, reads=reads)
        ctrl.spec = dataclasses.replace(ctrl.spec, host_callback=host_callback)
        runs[reads] = (ctrl, ctrl.run(ids, 40, MODEL.make_cache))
    assert [dataclasses.asdict(r) for r in runs["in_loop"][1]] == [dataclasses.asdict(r) for r in runs["host"][1]]
    reasons = {c.reason for r in runs["in_loop"][1] for c in r.calls}
    assert reasons >= ({"", "new_call"} if facts else {"empty"})
    _check_state_matches_fresh_context(*runs["in_loop"])


@pytest.mark.slow
def test_a_real_memory_whose_query_runs_jax_is_served_from_inside_the_loop():
    """The callback runs on the loop's host thread: a memory that runs jitted JAX code (like the BERT encoder
    of TripleMemory) must not deadlock; refused over-long names behave as on the host path."""
    import jax
    import jax.numpy as jnp

    from memllm_jax.config import MemoryConfig
    from memllm_jax.memory import TripleMemory
    from memllm_jax.memory.encoder import HashEncoder

    class JaxHashEncoder(HashEncoder):
        def encode(self, names):
            return jax.device_get(jax.jit(lambda x: x * 1.0)(jnp.asarray(super().encode(names))))

    def memory():
        mem = TripleMemory(JaxHashEncoder(dim=16), MemoryConfig(max_name_chars=8, index="exact"))
        mem.add([protocol.Triple("y", "r", "Rome")])
        return mem

    model = scripted("a({MEM_READ(y>>r>>)-->Rome})b({MEM_READ(", "ab({MEM_READ(" + "z" * 20 + ">>r>>)-->", "abc")
    res = {reads: generate_with_memory(model, TOK, memory(), ["Q|"], 80, chunk=8, reads=reads)[0]
           for reads in ("host", "in_loop")}
    assert dataclasses.asdict(res["in_loop"]) == dataclasses.asdict(res["host"])
    assert res["in_loop"].text == "abc"
    assert [(c.reason, c.result) for c in res["in_loop"].calls] == [("new_call", ("Rome",)), ("empty", ())]


def test_auto_picks_in_loop_reads_for_batches_and_host_reads_for_one_row(monkeypatch):
    """`reads="auto"` (the default): the measured choice, in-loop for several rows, the host for one."""
    from memllm_jax.decode.reader import choose_reads

    assert choose_reads("auto", 16) == "in_loop" and choose_reads("auto", 1) == "host"
    assert choose_reads("host", 16) == "host" and choose_reads("in_loop", 1) == "in_loop"
    used = []
    real = reader.ReadController.__init__

    def recording(self, *args, **kw):
        used.append(kw["reads"])
        real(self, *args, **kw)

    monkeypatch.setattr(reader.ReadController, "__init__", recording)
    script = "ab({MEM_READ(x>>r>>)-->"
    two = generate_with_memory(scripted(script, script), TOK, FakeMemory(FACTS), ["Q|", "Q|"], 30, chunk=8)
    one = generate_with_memory(scripted(script), TOK, FakeMemory(FACTS), ["Q|"], 30, chunk=8)
    assert used == ["in_loop", "host"] and two[0].text == one[0].text
