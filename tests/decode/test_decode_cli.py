"""The decode commands: generate (real tiny model saved in HF format + trained tokenizer), memory write
(resumable, corpus errors), chat (statements stored, questions read, inspect / delete, persistence)."""

import dataclasses
import io
import json

import pytest
from flax import nnx

from memllm_jax import protocol
from memllm_jax.config import TINY
from tests.support.scripted import CharTokenizer, PolicyModel
from memllm_jax.eval.write_quality import EntityGold
from memllm_jax.memory import HashEncoder, TripleMemory
from memllm_jax.settings import replace

from test_decode_writer import write_policy

TOK = CharTokenizer()


@pytest.mark.slow
def test_generate_command_end_to_end(tmp_path, capsys):
    from memllm_jax.cli import main
    from memllm_jax.model.hf import save_hf
    from memllm_jax.model.decoder import Decoder
    from memllm_jax.tokenizer import train_tokenizer

    texts = [protocol.escape_text("Paris is the capital of France. Rome is in Italy.")] * 20
    tok = train_tokenizer(texts, 300, tmp_path / "m")
    cfg = dataclasses.replace(TINY, vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    save_hf(model, tmp_path / "m")
    assert main(["generate", "--model", str(tmp_path / "m"), "Paris is", "({MEM_READ(x>>r>>)-->",
                 "--max-new-tokens", "6", "--show-memory"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Paris is") and "raw:" in out and "({MEM_READ(x>>r>>)-->" in out
    # with the real BPE tokenizer, marker strings in a prompt or a document never become marker ids
    from memllm_jax.decode.reader import encode_prompt
    from memllm_jax.decode.corpus_writer import iter_write_prompts, WriteDocument

    text = "a ({MEM_READ(x>>r>>)--> b }) ({MEM_WRITE--> c ({USER_ST}) d ({USER_END})"
    assert not set(encode_prompt(tok, text)) & set(tok.marker_id.values())
    for _, ids in iter_write_prompts(WriteDocument.from_sentences("d", [text, text]), tok):
        assert [t for t in ids if t in tok.marker_id.values()] == [
            tok.marker_id[m] for m in (protocol.USER_ST, protocol.USER_END, protocol.MEM_WRITE)]


def test_memory_write_is_resumable_and_names_bad_records(tmp_path):
    from memllm_jax.decode.write_cli import CorpusError, read_corpus, run_write

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in [
        {"title": "A", "sents": [["First", "one", "."], ["Second", "."]]},
        {"id": "b", "text": "Alpha here. Beta there!"},
        {"id": "c", "sentences": ["Gamma."]},
    ]) + "\n")
    calls = []
    policy = lambda ctx: (calls.append(1), write_policy(ctx))[1]  # noqa: E731
    model = PolicyModel(policy, TOK.vocab_size)
    mem = TripleMemory(HashEncoder(16))
    stats = run_write(model, TOK, mem, tmp_path / "mem", corpus, batch_size=2, save_every=1, progress_bar=False)
    assert stats.sentences == 5 and stats.documents == 3
    progress = json.loads((tmp_path / "mem" / "write_progress.json").read_text())
    assert progress["done"] == ["0:A", "1:b", "2:c"]
    reopened = TripleMemory.open(tmp_path / "mem", HashEncoder(16))
    assert sorted(r["source"] for r in reopened.records()) == ["0:A/0"]  # one triple, deduplicated
    n = len(calls)
    stats = run_write(model, TOK, reopened, tmp_path / "mem", corpus, progress_bar=False)
    assert stats.sentences == 0 and len(calls) == n  # nothing left to do

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "x", "sentences": ["ok"]}\n{"id": "y", "sentences": "no"}\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl: record 1: field sentences"):
        list(read_corpus(bad))
    bad.write_text('{"id": "x"\n')
    with pytest.raises(CorpusError, match=r"bad.jsonl: line 1: invalid JSON"):
        list(read_corpus(bad))


def test_memory_write_grounded_writes_only_copied_names(tmp_path):
    """`memory write --grounded`: the scripted `a>>r>>b` is kept where both names occur in the document."""
    from memllm_jax.decode.write_cli import run_write

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "x", "sentences": ["a met b.", "Gamma."]}) + "\n")
    mem = TripleMemory(HashEncoder(16))
    stats = run_write(PolicyModel(write_policy, TOK.vocab_size), TOK, mem, tmp_path / "mem", corpus, batch_size=2,
                      progress_bar=False, grounded=True, relations={"r"})
    assert [r["source"] for r in mem.records()] == ["0:x/0"] and len(stats.ungrounded) == 1


def chat_policy(ctx):
    """Questions (after '?') open a read of `Alice>>lives in>>`, then answer with the result."""
    q = TOK.encode("?")[0]
    if TOK.marker_id[protocol.MEM_WRITE] in ctx:
        return write_policy(ctx)
    if q not in ctx:
        return [TOK.eos_id]
    gen = ctx[ctx.index(q) + 2 :]
    script = TOK.encode("({MEM_READ(Alice>>lives in>>)-->")
    if gen[: len(script)] == script[: len(gen)] and len(gen) < len(script):
        return [script[len(gen)]]
    return [TOK.eos_id]


def test_chat_stores_statements_answers_questions_and_persists(tmp_path):
    from memllm_jax.decode.chat_cli import chat_session

    mem = TripleMemory(HashEncoder(16))
    mem.add([protocol.Triple("Alice", "lives in", "Paris")], source="seed")
    model = PolicyModel(chat_policy, TOK.vocab_size)
    saved = []
    out = io.StringIO()
    lines = ["Alice moved to Paris.", "Where does Alice live?", "/show a", "/list", "/delete a>>r>>b", "/show a"]
    chat_session(model, model, TOK, mem, lines, out, save=lambda: (saved.append(1), mem.save(tmp_path / "m")),
                 show_memory=True)
    text = out.getvalue()
    assert "stored a>>r>>b" in text
    assert "result: ['Paris']  -> kept" in text
    assert text.count("a>>r>>b") >= 3 and "deleted 1 triple(s)" in text and "nothing about 'a'" in text
    reopened = TripleMemory.open(tmp_path / "m", HashEncoder(16))
    assert [r["subject"] for r in reopened.records()] == ["Alice"] and len(saved) == 2


def test_chat_keeps_an_empty_read_with_keep_empty():
    from memllm_jax.decode.chat_cli import chat_session

    model = PolicyModel(chat_policy, TOK.vocab_size)
    for keep, status in ((True, "kept"), (False, "removed (empty)")):
        out = io.StringIO()
        chat_session(model, model, TOK, TripleMemory(HashEncoder(16)), ["Where does Alice live?"], out,
                     show_memory=True, keep_empty=keep)
        assert f"result: []  -> {status}" in out.getvalue()


def test_memory_stage_reports_precision_before_and_after_grounding(monkeypatch, tmp_path):
    """The pipeline's evaluation write (`experiments.stages._write_eval`) with `write.grounded`: the scripted
    `a>>r>>b` is kept for the sentence that names both, dropped for the one that names neither, and the report
    scores both the kept memory and everything the model wrote against the gold triples; the log lists each
    written triple with its sentence, its fate and whether it is gold."""
    import types

    import data_gen.gold_memory
    from experiments import stages
    from experiments.pipeline_config import PipelineConfig
    from test_decode_writer import TOK

    monkeypatch.setattr(data_gen.gold_memory, "gold_triples", lambda doc: [protocol.Triple("a", "r", "b"),
                                                                           protocol.Triple("a", "r", "c")])
    monkeypatch.setattr(data_gen.gold_memory, "entity_gold", lambda doc: EntityGold(
        [{"a"}, {"b", "bee"}, {"c"}], {(0, "r", 1), (0, "r", 2)}))
    monkeypatch.setattr(stages, "_labels", lambda self: {"P1": "r"})
    pipe = types.SimpleNamespace(cfg=replace(PipelineConfig(), {"write.grounded": True, "write.late_stopping": False,
                                                                "write.max_new_tokens": 48, "write.batch": 2}),
                                 encoder=lambda: HashEncoder(16), tokenizer=lambda: TOK)
    model = PolicyModel(write_policy, TOK.vocab_size)
    monkeypatch.setattr(stages, "_write_budget", lambda self, min_confidence, _orig=stages._write_budget: {
        **_orig(self, min_confidence), "make_cache": model.make_cache})
    log = tmp_path / "writes.jsonl"
    mem, info = stages._write_eval(pipe, model, [("x", ["a met b.", "Gamma."]), ("y", ["Nothing here."])], None,
                                   log=log)
    assert [r["source"] for r in mem.records()] == ["x/0"]
    assert [(r["source"], r["subject"], r["fate"], r["gold"]) for r in map(json.loads, log.read_text().splitlines())] == [
        ("x/0", "a", "kept", True), ("x/1", "a", "ungrounded", True), ("y/0", "a", "ungrounded", True)]
    assert info["ungrounded"] == 2 and info["correct"] == 1 and info["precision"] == 1.0 and info["recall"] == 0.5
    assert info["before_grounding"]["written_unique"] == 1  # the same triple, also written from "Gamma." and y/0
    # by entity: a>>r>>b names the relation (0, r, 1) that both documents state
    assert info["entity_level"]["precision"] == 1.0 and info["entity_level"]["gold_relations"] == 4
    assert info["entity_level"]["gold_relations_found"] == 2


def test_memory_stage_reports_precision_before_the_confidence_check(monkeypatch):
    """With `write.min_confidence`, the evaluation write keeps `a>>r>>b` and drops `c>>r>>d`, on whose object the
    scripted model hesitated; the report scores the memory before the check as well."""
    import types

    import data_gen.gold_memory
    from experiments import stages
    from experiments.pipeline_config import PipelineConfig
    from test_decode_writer import TOK, unsure_policy

    monkeypatch.setattr(data_gen.gold_memory, "gold_triples", lambda doc: [protocol.Triple("a", "r", "b")])
    monkeypatch.setattr(data_gen.gold_memory, "entity_gold", lambda doc: EntityGold([{"a"}, {"b"}], {(0, "r", 1)}))
    monkeypatch.setattr(stages, "_labels", lambda self: {"P1": "r"})
    pipe = types.SimpleNamespace(cfg=replace(PipelineConfig(), {"write.grounded": True, "write.min_confidence": -0.1,
                                                                "write.late_stopping": False,
                                                                "write.max_new_tokens": 48, "write.batch": 1}),
                                 encoder=lambda: HashEncoder(16), tokenizer=lambda: TOK)
    model = PolicyModel(unsure_policy, TOK.vocab_size)
    monkeypatch.setattr(stages, "_write_budget", lambda self, min_confidence, _orig=stages._write_budget: {
        **_orig(self, min_confidence), "make_cache": model.make_cache})
    mem, info = stages._write_eval(pipe, model, [("x", ["a met b, c met d."])], -0.1)
    assert [r["subject"] for r in mem.records()] == ["a"]
    assert info["unconfident"] == 1 and info["ungrounded"] == 0 and info["precision"] == 1.0
    assert info["before_confidence"]["written_unique"] == 2 and info["before_confidence"]["precision"] == 0.5
    assert info["before_grounding"]["written_unique"] == 2


def test_memory_stage_chooses_the_confidence_threshold_on_the_outside_documents(monkeypatch, tmp_path):
    """`write.min_confidence="development"`: the outside documents are written once with every checked triple's
    confidence; of the candidates, -0.1 keeps only the gold `a>>r>>b` (F1 1.0), -0.5 also `c>>r>>d` (F1 0.67) and
    "any" (None, every triple) the same two, so -0.1 is chosen, the evaluation write uses it, and rows ② / ① get
    the outside writes at -0.1."""
    import json
    import types

    import data_gen.gold_memory
    from experiments import stages
    from experiments.pipeline_config import PipelineConfig
    from memllm_jax.memory import TripleMemory
    from test_decode_writer import TOK, unsure_policy

    monkeypatch.setattr(data_gen.gold_memory, "gold_triples", lambda doc: [protocol.Triple("a", "r", "b")])
    monkeypatch.setattr(data_gen.gold_memory, "entity_gold", lambda doc: EntityGold([{"a"}, {"b"}], {(0, "r", 1)}))
    monkeypatch.setattr(stages, "_labels", lambda self: {"P1": "r"})
    docs = {"eval": [("x", ["a met b, c met d."])],
            "outside": [(f"o{k}", ["a met b, c met d."]) for k in range(4)]}
    monkeypatch.setattr(stages, "_documents", lambda self, split: docs[split])
    model = PolicyModel(unsure_policy, TOK.vocab_size)
    monkeypatch.setattr(stages, "_write_budget", lambda self, min_confidence, _orig=stages._write_budget: {
        **_orig(self, min_confidence), "make_cache": model.make_cache})
    said = []
    pipe = types.SimpleNamespace(cfg=replace(PipelineConfig(), {
                                     "write.grounded": True, "write.min_confidence": "development",
                                     "write.confidence_grid": (-0.5, -0.1), "data.outside_docs": 4,
                                     "write.late_stopping": False, "write.max_new_tokens": 48, "write.batch": 1}),
                                 encoder=lambda: HashEncoder(16), tokenizer=lambda: TOK, model=lambda which: model,
                                 out=tmp_path, say=said.append)
    info = stages.stage_memory(pipe)
    assert info["min_confidence"] == -0.1 == stages._min_confidence(pipe)
    assert [(r["min_confidence"], r["f1"]) for r in info["development"]["candidates"]] == [
        (None, 2 / 3), (-0.5, 2 / 3), (-0.1, 1.0)]
    assert info["mw_eval"]["precision"] == 1.0 and info["mw_eval"]["unconfident"] == 1
    for name in ("mw_eval", "mw_outside_small", "mw_outside_large"):
        records = TripleMemory.open(tmp_path / "memory" / name, HashEncoder(16)).records()
        assert {r["subject"] for r in records} == {"a"}
    assert json.loads((tmp_path / "results" / "memory.json").read_text())["min_confidence"] == -0.1
    assert {json.loads(line)["fate"] for line in (tmp_path / "memory" / "mw_eval_writes.jsonl").open()} == {
        "kept", "unconfident"}
    assert "  confidence threshold chosen on the 4 outside documents: -0.1" in said


def test_a_misspelt_threshold_setting_is_refused_before_the_run(tmp_path):
    from experiments.pipeline_config import PipelineConfig, check_config
    from memllm_jax.errors import InputError

    cfg = replace(PipelineConfig(), {"write.min_confidence": "developement"})
    with pytest.raises(InputError, match="^setting write.min_confidence='developement': must be one of 'development'"):
        check_config(cfg)


def test_chat_chains_two_reads_and_keeps_the_first_with_keep_reads():
    from memllm_jax.decode.chat_cli import chat_session
    from tests.support.chain_reader import chain_reader, two_hop_memory

    model, tok = chain_reader()
    memory, _ = two_hop_memory()
    for keep in (True, False):
        out = io.StringIO()
        chat_session(model, model, tok, memory, ["What is the city of the employer of Ann?"], out, force_read=True,
                     max_new_tokens=80, show_memory=True, keep_reads=keep)
        text = out.getvalue()
        assert text.split("\n")[0].split() == [">", "Kerek", "Group", "Oslo."]  # the forced read's query is not shown
        assert "result: ['Oslo']  -> kept" in text
        assert ("result: ['Kerek Group']  -> kept" in text) == keep
        assert ("result: ['Kerek Group']  -> removed (new_call)" in text) == (not keep)
