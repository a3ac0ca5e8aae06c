"""The stages of `experiments.pipeline.Pipeline` (each a method taking the pipeline; returns stamp info)."""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import random
import shutil

from experiments.pipeline_config import stage_key, train_overrides
from memllm_jax.errors import InputError, load_json
from memllm_jax.files import atomic_write_json, atomic_write_text


def _save_json(path: pathlib.Path, obj) -> None:
    """A stage's JSON output (results, splits), written atomically; values JSON lacks are written as text."""
    atomic_write_json(path, obj, indent=1, default=str)


def _labels(self):
    from data_gen.cli import _labels as data_labels

    if self.cfg.corpus == "synthetic":
        from data_gen.synthetic import synthetic_rel_info

        return synthetic_rel_info()
    return data_labels(self.cfg.labels or None, self.cfg.corpus)


def _documents(self, split: str):
    from data_gen.docred import load_documents

    return load_documents(str(self.out / "data" / f"{split}.json"), _labels(self))


def _load_corpus_file(path: str, field: str) -> list:
    path = pathlib.Path(path)
    if not path.exists():
        raise InputError(f"{path}: corpus file not found (PipelineConfig.{field})")
    raw = load_json(path)
    if not isinstance(raw, list):
        raise InputError(f"{path}: expected a JSON array of DocRED-format documents (PipelineConfig.{field})")
    return raw


def stage_corpus(self):
    cfg, data = self.cfg, self.out / "data"
    n_eval, n_out = cfg.eval_docs, cfg.outside_docs
    if cfg.corpus == "synthetic" and cfg.eval_corpus:
        raise InputError(f"eval_corpus={cfg.eval_corpus!r} needs a DocRED-format file as corpus, not \"synthetic\" "
                         "(PipelineConfig.eval_corpus)")
    if cfg.corpus == "synthetic" and cfg.heldout_world:
        from data_gen.synthetic import heldout_split

        train, heldout = heldout_split(cfg.synth_docs - n_eval - n_out, n_eval + n_out, seed=cfg.synth_seed)
        raw = train + heldout
    elif cfg.corpus == "synthetic":
        from data_gen.synthetic import iter_synthetic

        raw = list(iter_synthetic(cfg.synth_docs, seed=cfg.synth_seed))
    else:
        raw = _load_corpus_file(cfg.corpus, "corpus")
        if cfg.eval_corpus:  # a separate evaluation file: its last documents are the evaluation (and outside) ones
            held = _load_corpus_file(cfg.eval_corpus, "eval_corpus")
            if len(held) < n_eval + n_out:
                raise InputError(f"{cfg.eval_corpus}: {len(held)} documents, fewer than eval_docs + outside_docs = "
                                 f"{n_eval + n_out} (PipelineConfig.eval_corpus)")
            raw = raw + held[len(held) - n_eval - n_out:]
    if len(raw) <= n_eval + n_out:
        raise SystemExit(f"corpus has {len(raw)} documents; eval_docs + outside_docs = {n_eval + n_out} leaves none to train on")
    split = {"train": raw[: len(raw) - n_eval - n_out], "outside": raw[len(raw) - n_eval - n_out: len(raw) - n_eval],
             "eval": raw[len(raw) - n_eval:]}
    if cfg.train_docs:
        if not 0 < cfg.train_docs <= len(split["train"]):
            raise InputError(f"train_docs={cfg.train_docs}: the corpus leaves {len(split['train'])} training documents "
                             "(PipelineConfig.train_docs)")
        split["train"] = split["train"][: cfg.train_docs]
    for name, docs in split.items():
        _save_json(data / f"{name}.json", docs)
    _save_json(data / "rel_info.json", _labels(self))
    from data_gen.build import build_all

    labels = _labels(self)
    variants = (f" (memory-write examples also from {cfg.write_counterfactual} counterfactual variants)"
                if cfg.write_counterfactual else "")
    self.say(f"  building write / read / lm examples from {len(split['train'])} training documents{variants}")
    st_train = build_all(str(data / "train.json"), str(data / "train"), labels, kinds={"write", "read", "lm"},
                         counterfactual=cfg.write_counterfactual, counterfactual_kinds={"write"},
                         context_free=cfg.write_context_free, read_context_free=cfg.read_context_free,
                         question_form=cfg.write_question_form, read_question_form=cfg.read_question_form,
                         misread_rate=cfg.read_misread_rate, write_evidence=cfg.write_evidence, seed=cfg.synth_seed)
    self.say(f"  building eval records for {len(split['eval'])} held-out documents")
    build_all(str(data / "eval.json"), str(data / "eval"), labels, kinds={"eval", "write", "read"},
              write_evidence=cfg.write_evidence)
    from data_gen.overlap import heldout_overlap
    from memllm_jax.eval.records import load_eval_docs

    overlap = heldout_overlap(_documents(self, "train"), _documents(self, "eval"),
                              [t for d in load_eval_docs(data / "eval" / "eval.jsonl") for r in d.reads for t in r.targets])
    _save_json(self.out / "results" / "corpus.json", {"documents": {k: len(v) for k, v in split.items()},
                                                       "heldout_world": cfg.corpus == "synthetic" and cfg.heldout_world,
                                                       "overlap": overlap})
    self.say(f"  evaluation facts stated in training documents: {overlap['triples_in_train']:.3f} of gold triples, "
             f"{overlap['targets_in_train']:.3f} of TARGET mentions ({overlap['named_targets_in_train']:.3f} without dates)")
    return {"documents": {k: len(v) for k, v in split.items()}, "train_stats": st_train.to_json(), "overlap": overlap}


def stage_tokenizer(self):
    from memllm_jax.tokenizer import load_tokenizer, train_tokenizer
    from memllm_jax.train.data import read_jsonl

    if self.cfg.base_model:  # a pretrained base brings its own tokenizer (the API markers are added to it)
        tok = load_tokenizer(_base_dir(self))
        tok.save(self.out / "tokenizer")
        self._cache.pop("tok", None)
        return {"base_model": self.cfg.base_model, "vocab_size": tok.vocab_size}

    # with the API examples included, relation names and `>>` get their own tokens, which shortens the
    # memory-write / memory-read spans by about a third
    texts = [seg["text"] for kind in self.cfg.tokenizer_texts
             for _, rec in read_jsonl(str(self.out / "data" / "train" / f"{kind}.jsonl")) for seg in rec["segments"]]
    train_tokenizer(texts, self.cfg.vocab_size, self.out / "tokenizer")
    self._cache.pop("tok", None)
    return {"texts": len(texts)}


def _train(self, section: str, module: str, data_file: str, init: str | None):
    from experiments.training import run_training

    data = self.out / "data" / "train" / data_file
    workdir = _training_workdir(self, section)
    return run_training(module, section, train_overrides(self.cfg), train_data=str(data),
                        tokenizer=str(self.out / "tokenizer"), workdir=str(workdir), init=init, say=self.say)


def _training_workdir(self, section: str) -> pathlib.Path:
    """The stage's training directory, emptied first when it holds a run this stage must not resume: one that
    finished (the stage is rerun because its settings or data changed, or by --force) or one that was
    interrupted under other settings. An interrupted run under the same settings is resumed. The stage's key is
    kept in the directory (`stage_key`) for that check."""
    workdir, stamp = self.out / "train" / section, self.out / "stages" / f"{section}.json"
    key, key_file = stage_key(self.cfg, section), workdir / "stage_key"
    if workdir.exists() and (stamp.exists() or (key_file.exists() and key_file.read_text() != key)):
        self.say(f"  {workdir}: trained before under other settings or data; starting over")
        shutil.rmtree(workdir)
    stamp.unlink(missing_ok=True)  # it describes the run just removed; an interruption from here on resumes
    workdir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(key_file, key)
    return workdir


def _base_dir(self) -> str:
    """The pretrained base as an HF directory (a GGUF file is converted once, into a cache directory)."""
    from memllm_jax.model.gguf import resolve_model_dir

    return str(resolve_model_dir(self.cfg.base_model))


def _base(self) -> str:
    return _base_dir(self) if self.cfg.base_model else str(self.out / "train" / "pretrain")


def stage_pretrain(self):
    if self.cfg.base_model:
        self.say(f"  base model: {self.cfg.base_model} (no pretraining)")
        return {"base_model": self.cfg.base_model}
    return _train(self, "pretrain", self.cfg.pretrain_config, "lm.jsonl", None)


def stage_mw(self):
    return _train(self, "mw", self.cfg.mw_config, "write.jsonl", _base(self))


def stage_mr(self):
    return _train(self, "mr", self.cfg.mr_config, "read.jsonl", _base(self))


def stage_judge(self):
    """The triple judge's adapter (`judge_config`; `decode.judge`), trained on examples built here from the
    training documents (`data_gen.judge_examples`); nothing when the config has no judge."""
    if not self.cfg.judge_config:
        return {"judge": None}
    from data_gen.judge_examples import judge_records

    records = judge_records(_documents(self, "train"), negatives=self.cfg.judge_negatives)
    atomic_write_text(self.out / "data" / "train" / "judge.jsonl", "".join(json.dumps(r) + "\n" for r in records))
    self.say(f"  judge examples: {len(records)} ({sum(r['label'] for r in records)} positive) from the training documents")
    return {"examples": len(records), **_train(self, "judge", self.cfg.judge_config, "judge.jsonl", _base(self))}


def _judge(self):
    """The triple judge (`decode.judge.TripleJudge`) when the config has one, else None."""
    if not self.cfg.judge_config:
        return None
    if "triple_judge" not in self._cache:
        from memllm_jax.decode.judge import TripleJudge

        self._cache["triple_judge"] = TripleJudge(self.model("judge"), self.tokenizer())
    return self._cache["triple_judge"]


def _judged(self, judge, docs, scored: list) -> list:
    """`WriteStats.scored` of `docs` with the judge's log-odds as the confidences (unchanged without a judge)."""
    from memllm_jax.decode.judge import judge_scored

    return scored if judge is None else judge_scored(judge, docs, scored)


DEVELOPMENT = "development"


def _min_confidence(self) -> float | None:
    """The memory stage's confidence threshold: the setting, or the one it chose on the development documents."""
    if self.cfg.write_min_confidence == DEVELOPMENT:
        chosen = self.out / "results" / "memory.json"
        if not chosen.exists():
            raise InputError(f"{chosen}: not found; write_min_confidence='development' is chosen by the memory stage: "
                             "run it first (memllm run --stage memory)")
        return json.loads(chosen.read_text())["min_confidence"]
    return self.cfg.write_min_confidence


def _write_relations(self) -> set[str] | None:
    """The relation labels written triples are checked against (`write_grounded`) and copied from
    (`write_copied_names`)."""
    return set(_labels(self).values()) if self.cfg.write_grounded or self.cfg.write_copied_names else None


def _write_decoding(self, relations: set[str] | None):
    """How the config's memory-write calls are decoded (`write_*` settings; `decode.writer.WriteDecoding`);
    `relations`: `_write_relations`."""
    from memllm_jax.decode.writer import write_decoding

    try:
        return write_decoding(self.tokenizer(), ban_repeats=self.cfg.write_ban_repeats,
                              copied_names=self.cfg.write_copied_names, relations=relations,
                              max_new_tokens=self.cfg.write_max_new_tokens, late_stopping=self.cfg.write_late_stopping,
                              stop_repeats=self.cfg.write_stop_repeats, close_bias=self.cfg.write_close_bias)
    except ValueError as exc:
        raise InputError(f"PipelineConfig.write_{exc}") from exc  # the field's name begins the message


def _write_budget(self, min_confidence: float | None) -> dict:
    """`write_corpus`'s settings for the config: its decoding, batching and checks."""
    relations = _write_relations(self)  # read once for the decoding's copy spec and the grounding check
    return dict(decoding=_write_decoding(self, relations), batch_size=self.cfg.write_batch,
                refill=self.cfg.write_refill, grounded=self.cfg.write_grounded, relations=relations,
                min_confidence=min_confidence)


def _edit_checks(self) -> dict:
    """How the edits of Table 3 are written: the memory stage's decoding with an edit's budget
    (`editing.EDIT_WRITE_TOKENS`), and its grounding and confidence checks when `editing_write_checks`."""
    from memllm_jax.eval.editing import EDIT_WRITE_TOKENS

    budget = _write_budget(self, _min_confidence(self))
    checks = ("grounded", "relations", "min_confidence") if self.cfg.editing_write_checks else ()
    if self.cfg.judge_config:  # the chosen threshold is the judge's, and the edits are not judged
        checks = tuple(c for c in checks if c != "min_confidence")
    return {"write_decoding": dataclasses.replace(budget["decoding"], max_new_tokens=EDIT_WRITE_TOKENS),
            **{k: budget[k] for k in checks}}


def _write_docs(self, mw, memory, docs, min_confidence: float | None, on_batch=None):
    """Write `docs` into `memory`, keeping the triples with at least `min_confidence`: the memory-write model's own
    confidence or, with a judge, the judge's log-odds (every grounded triple is written, then judged)."""
    from memllm_jax.decode.corpus_writer import write_corpus, write_rescored
    from memllm_jax.memory import TripleMemory

    judge = _judge(self)
    if judge is None:
        return write_corpus(mw, self.tokenizer(), memory, docs, on_batch=on_batch, **_write_budget(self, min_confidence))
    st = write_corpus(mw, self.tokenizer(), TripleMemory(self.encoder()), docs, on_batch=on_batch,
                      **_write_budget(self, -float("inf")))
    return write_rescored(memory, st, _judged(self, judge, docs, st.scored), min_confidence)


def _write_eval(self, mw, eval_docs, min_confidence: float | None, on_batch=None, log: pathlib.Path | None = None):
    """The memory-write model `mw` writes the evaluation documents into a new memory: `(memory, info)`, info with
    the write statistics and the agreement with the documents' gold triples (precision / recall / F1, by name,
    and by entity under "entity_level": `eval.write_quality`). `log`: a JSON-lines file of every triple written,
    its sentence, whether it is gold (by name), what the checks made of it and the confidence it was kept or dropped
    by (the judge's log-odds with a judge; null when no confidence was checked)."""
    from data_gen.gold_memory import entity_gold, gold_triples
    from memllm_jax.eval.write_quality import entity_agreement, triple_key, write_agreement
    from memllm_jax.memory import TripleMemory

    mem = TripleMemory(self.encoder())
    st = _write_docs(self, mw, mem, eval_docs, min_confidence, on_batch)
    gold, kept = [t for d in eval_docs for t in gold_triples(d)], mem.records()
    info = {"sentences": st.sentences, "triples": st.triples, "malformed": st.malformed, "no_cut": st.no_cut,
            "repeats": st.repeats, "tokens": st.tokens,
            **{k: v for k, v in mem.stats().items() if isinstance(v, (int, float))},
            **write_agreement(kept, gold),
            "entity_level": entity_agreement(kept, [entity_gold(d) for d in eval_docs])}
    # what the model wrote before each check, for comparison
    if self.cfg.write_grounded:
        info["ungrounded"] = len(st.ungrounded)
        info["before_grounding"] = write_agreement(kept + st.unconfident + st.ungrounded, gold)
    if min_confidence is not None:
        info["unconfident"] = len(st.unconfident)
        info["before_confidence"] = write_agreement(kept + st.unconfident, gold)
    if log is not None:
        gold_keys = {triple_key(t) for t in gold}
        confidence = {(source, t): c for source, t, c in st.scored if c > -float("inf")}  # the judge's, with one
        atomic_write_text(log, "".join(json.dumps({"source": source, "subject": t.subject, "relation": t.relation,
                                              "object": t.object, "fate": fate, "gold": triple_key(t) in gold_keys,
                                              "confidence": confidence.get((source, t))})
                                  + "\n" for source, t, fate in st.written))
    return mem, info


def _choose_min_confidence(self, mw, outside, on_batch) -> tuple[float, dict, list]:
    """Write the outside documents keeping every grounded triple with its confidence, and choose the threshold
    with the highest F1 against their gold triples among `write_confidence_grid` and None (keep every triple, so
    the choice is never worse on them than no threshold): `(threshold, report, [scored writes of the quarter, of
    the rest])`, the scored writes to fill rows ② / ① at that threshold without decoding again."""
    from data_gen.gold_memory import gold_triples
    from memllm_jax.decode.corpus_writer import write_corpus
    from memllm_jax.eval.write_quality import choose_min_confidence, scored_auc, threshold_label
    from memllm_jax.memory import TripleMemory

    if not outside:
        raise InputError(f'PipelineConfig.write_min_confidence="{DEVELOPMENT}" needs outside documents '
                         "(outside_docs > 0) to choose the threshold on")
    quarter, scored, judge, writer_scored = max(1, len(outside) // 4), [], _judge(self), []
    for docs in (outside[:quarter], outside[quarter:]):
        scratch = TripleMemory(self.encoder())
        st = write_corpus(mw, self.tokenizer(), scratch, docs, on_batch=on_batch,
                          **_write_budget(self, -float("inf")))
        writer_scored += st.scored
        scored.append(_judged(self, judge, docs, st.scored))
    gold = [t for d in outside for t in gold_triples(d)]
    threshold, rows = choose_min_confidence([(t, c) for part in scored for _, t, c in part], gold,
                                            tuple(self.cfg.write_confidence_grid) + (None,))
    report = {"documents": len(outside), "rule": "highest F1", "candidates": rows}
    if judge is not None:  # how well each score tells the gold triples from the others
        report["auc"] = {"judge": scored_auc([x for part in scored for x in part], gold),
                         "writer_confidence": scored_auc(writer_scored, gold)}
        judge_auc, writer_auc = (f"{x:.3f}" if x is not None else "-" for x in report["auc"].values())
        self.say(f"  development: AUC of the judge's log-odds {judge_auc}, of the writer's own confidence {writer_auc} "
                 "(gold triples against the others)")
    for r in rows:
        self.say(f"  development, confidence >= {threshold_label(r['min_confidence'])}: precision {r['precision']:.3f} "
                 f"recall {r['recall']:.3f} f1 {r['f1']:.3f}")
    self.say(f"  confidence threshold chosen on the {len(outside)} outside documents: {threshold}")
    return threshold, report, scored


def stage_memory(self):
    from data_gen.gold_memory import fill_memory
    from memllm_jax.decode.corpus_writer import write_scored
    from memllm_jax.memory import TripleMemory

    setting = self.cfg.write_min_confidence
    if isinstance(setting, str) and setting != DEVELOPMENT:
        raise InputError(f'PipelineConfig.write_min_confidence: expected a number, None or "{DEVELOPMENT}", '
                         f"got {setting!r}")
    enc, mw, info = self.encoder(), self.model("mw"), {}
    eval_docs = _documents(self, "eval")
    outside = _documents(self, "outside") if self.cfg.outside_docs else []
    gold = TripleMemory(enc)
    info["gold_triples"] = fill_memory(gold, eval_docs)
    gold.save(self.out / "memory" / "gold")

    def on_batch(stats, finished):
        if finished:
            self.say(f"  memory write: {stats.documents} documents, {stats.sentences} sentences, {stats.triples} triples")

    scored = None
    if self.cfg.write_min_confidence == DEVELOPMENT:
        info["min_confidence"], info["development"], scored = _choose_min_confidence(self, mw, outside, on_batch)
    else:
        info["min_confidence"] = self.cfg.write_min_confidence
    mem, info["mw_eval"] = _write_eval(self, mw, eval_docs, info["min_confidence"], on_batch,
                                       log=self.out / "memory" / "mw_eval_writes.jsonl")
    mem.save(self.out / "memory" / "mw_eval")
    if outside:
        quarter = max(1, len(outside) // 4)
        big = TripleMemory.open(self.out / "memory" / "mw_eval", enc)  # the outside corpus plus the evaluation one
        # row ② holds a quarter of the outside documents, row ① all of them: write the quarter, save, go on
        for k, (name, docs) in enumerate((("mw_outside_small", outside[:quarter]),
                                          ("mw_outside_large", outside[quarter:]))):
            if scored is not None:  # written already, while choosing the threshold
                write_scored(big, scored[k], info["min_confidence"])
            else:
                _write_docs(self, mw, big, docs, info["min_confidence"], on_batch)
            big.save(self.out / "memory" / name)
            info[name] = big.stats()["triples"]
    _save_json(self.out / "results" / "memory.json", info)
    agree = info["mw_eval"]
    self.say(f"  gold memory: {info['gold_triples']} triples; MW memory: {agree['triples']} triples written, "
             f"precision {agree['precision']:.2f} recall {agree['recall']:.2f} against the gold triples (by entity: "
             f"{agree['entity_level']['precision']:.2f} / {agree['entity_level']['recall']:.2f})")
    return info


CURVE_FIELDS = ("precision", "recall", "f1", "correct", "written_unique", "gold_unique", "sentences", "no_cut")


def _mw_curve(self, final: dict) -> list[dict]:
    """The memory-write learning curve: each earlier export of the MW adapter (`mw.export_steps`) writes the
    evaluation documents as the memory stage does; the final model's point is the memory stage's own."""
    from memllm_jax.checkpoint import stored_steps
    from memllm_jax.model.load import load

    model_dir = self.out / "train" / "mw" / "model"
    steps = stored_steps(model_dir) if model_dir.is_dir() else []
    points = []
    for step in steps[:-1]:
        mw = self._fit_context(load(self.out / "train" / "mw", tokenizer=self.tokenizer(), step=step)[0], "mw")
        _, info = _write_eval(self, mw, _documents(self, "eval"), _min_confidence(self))
        points.append({"step": step, **{k: info[k] for k in CURVE_FIELDS}})
        self.say(f"  mw step {step}: precision {info['precision']:.2f} recall {info['recall']:.2f} f1 {info['f1']:.2f}")
    if steps:
        points.append({"step": steps[-1], **{k: final.get(k) for k in CURVE_FIELDS}})
    return points


def _training_calls_agreement(self, eval_docs) -> dict:
    """The evaluation documents' own memory-write calls (as their training examples would be built,
    `write_examples.taught_triples`) scored like the model's writes, by name and by entity: what a model that
    learned its training calls exactly would reach, so the model's figures read against the rule it was taught."""
    from data_gen.gold_memory import entity_gold, gold_triples
    from data_gen.write_examples import taught_triples
    from memllm_jax.eval.write_quality import entity_agreement, write_agreement

    taught = taught_triples(eval_docs, evidence=self.cfg.write_evidence)
    return {**write_agreement(taught, [t for d in eval_docs for t in gold_triples(d)]),
            "entity_level": entity_agreement(taught, [entity_gold(d) for d in eval_docs])}


def _by_relation_frequency(self, written: list[dict], eval_docs) -> list[dict]:
    """The memory's writes (`written`: its records) against the evaluation documents' gold triples in groups of relations by how often the
    training memory-write examples teach them (`write_quality.agreement_by_relation_frequency`)."""
    from data_gen.gold_memory import gold_triples
    from memllm_jax.eval.write_quality import agreement_by_relation_frequency, normalize_name
    from memllm_jax.train.data import read_jsonl

    taught = collections.Counter(normalize_name(t[1]) for _, rec in read_jsonl(str(self.out / "data" / "train" / "write.jsonl"))
                                 for t in rec.get("triples", ()))
    return agreement_by_relation_frequency(written, [t for d in eval_docs for t in gold_triples(d)], taught)


def stage_diagnostics(self):
    """The adapters' skills on the held-out documents: field-split loss / accuracy of their API calls (the copy
    probe: names reproduced exactly) and how many of the written names occur in the text they were written from."""
    from memllm_jax.eval.diagnostics import field_losses, names_in_text
    from memllm_jax.train.data import read_jsonl

    tok, info = self.tokenizer(), {}
    for which, kind in (("mw", "write"), ("mr", "read")):
        records = [rec for _, rec in read_jsonl(str(self.out / "data" / "eval" / f"{kind}.jsonl"))]
        info[which] = field_losses(self.model(which), tok, records, batch_size=self.cfg.eval_batch,
                                   max_records=self.cfg.diagnostic_examples)
        f = info[which]
        self.say(f"  {which} on held-out {kind} calls: loss name {f['name']['loss']:.3f} / relation "
                 f"{f['relation']['loss']:.3f} / markup {f['markup']['loss']:.3f} nats; names copied exactly "
                 f"{f['name_exact']:.2f} of {f['names']}")
    records = self.memory("mw_eval").records()
    written = [n for rec in records for n in (rec["subject"], rec["object"])]
    eval_docs = _documents(self, "eval")
    info["mw_names_in_eval_text"] = names_in_text(written, "\n".join(d.text for d in eval_docs))
    memory = json.loads((self.out / "results" / "memory.json").read_text())
    info["mw_against_gold"] = {k: memory["mw_eval"][k] for k in ("precision", "recall", "f1", "correct",
                                                                  "written_unique", "gold_unique")}
    for check in ("before_grounding", "before_confidence", "entity_level"):
        if check in memory["mw_eval"]:
            info["mw_against_gold"][check] = memory["mw_eval"][check]
    info["mw_against_gold"]["training_calls"] = _training_calls_agreement(self, eval_docs)
    info["mw_against_gold"]["by_relation_frequency"] = _by_relation_frequency(self, records, eval_docs)
    if "development" in memory:
        info["mw_threshold"] = {"min_confidence": memory["min_confidence"], **memory["development"]}
    info["mw_curve"] = _mw_curve(self, memory["mw_eval"])
    _save_json(self.out / "results" / "diagnostics.json", info)
    self.say(f"  mw: {info['mw_names_in_eval_text']['fraction']:.2f} of written names occur in the evaluation text")
    return {}


TRACE_DOCS = 3
"""Evaluation documents whose read trace (eval/trace.py) each Table 2 row saves for the HTML report."""


def stage_table2(self):
    from experiments.tables import plot_table2, table2_markdown
    from memllm_jax.eval.perplexity import evaluate_perplexity
    from memllm_jax.eval.rows import get_rows

    if not self.cfg.rows:
        self.say("  no rows selected: skipped (earlier results kept)")
        return {"skipped": True}
    # rows evaluated earlier (e.g. one row per sweep point) are kept; the rows run now replace theirs
    path = self.out / "results" / "table2.json"
    docs, tok = self.eval_docs(), self.tokenizer()
    results = {k: v for k, v in (json.loads(path.read_text()) if path.exists() else {}).items() if k not in self.cfg.rows}
    for row in get_rows(self.cfg.rows):
        if row.memory.startswith("mw_outside") and not self.cfg.outside_docs:
            self.say(f"  {row.name}: skipped (outside_docs = 0)")
            continue
        memory = None if row.memory == "none" else self.memory(row.memory)
        model = self.model("base" if row.model == "base" else "mr")
        setting = row.read
        if setting.positions == "model" and self.cfg.read_threshold is not None:
            setting = dataclasses.replace(setting, read_threshold=self.cfg.read_threshold)
        res = evaluate_perplexity(model, tok, docs, memory, setting, batch_size=self.cfg.eval_batch, progress=self.say,
                                  trace_docs=TRACE_DOCS)
        results[row.key] = {"name": row.name, "description": row.description, **res.to_json()}
        _save_json(self.out / "results" / "traces" / f"{row.key}.json", res.traces)  # for index.html
        p = res.ppl
        self.say(f"  {row.name:12s} OVERALL {p['overall']:.3f}  TARGET {p['target']:.3f}  ENTITY {p['entity']:.3f}"
                 f"  reads {res.stats['reads']} ({res.stats['reads_with_results']} with results)")
        _save_json(path, results)
    md = table2_markdown(results)
    atomic_write_text(self.out / "results" / "table2.md", md + "\n")
    plot_table2(results, self.out / "results" / "table2.png")
    self.say(md)
    return {"rows": list(results)}


def _synthetic_edit_records(self) -> list:
    """The Table 3 analogue's edits, at most one per subject and kind of answer. With a held-out world they are
    drawn from a third world's documents (`data_gen.synthetic.edit_world_documents`: no name of the corpus, 2
    documents per edit); otherwise from the evaluation and outside documents' facts."""
    from data_gen.docred import documents_from_raw
    from data_gen.edits import synthetic_edits
    from data_gen.gold_memory import gold_triples

    splits = ("eval", "outside") if self.cfg.outside_docs else ("eval",)
    if self.cfg.corpus == "synthetic" and self.cfg.heldout_world:
        from data_gen.overlap import heldout_overlap
        from data_gen.synthetic import edit_world_documents

        corpus = [d for split in ("train",) + splits for d in _documents(self, split)]
        names = {m.text for d in corpus for e in d.entities for m in e.full_mentions}
        docs = list(documents_from_raw(edit_world_documents(2 * self.cfg.n_edits, self.cfg.synth_seed, names),
                                       _labels(self), source="edit world"))
        overlap = heldout_overlap(corpus, docs, [])
        self.say(f"  editing: {len(docs)} edit-world documents; their facts stated in the corpus: "
                 f"{overlap['triples_in_train']:.3f}")
    else:
        docs = [d for split in splits for d in _documents(self, split)]
    kinds = {e.name: e.type for d in docs for e in d.entities}
    return synthetic_edits([t for d in docs for t in gold_triples(d)], self.cfg.n_edits, object_kinds=kinds)


def stage_editing(self):
    from experiments.tables import table3_markdown
    from memllm_jax.eval.editing import ZSRE_SHOTS, evaluate_editing, load_zsre

    if not self.cfg.editing:
        return {"skipped": True}
    if self.cfg.editing == "synthetic":
        records, shots, style = _synthetic_edit_records(self), (), "cloze"
        if len(records) < self.cfg.n_edits:
            self.say(f"  editing: {len(records)} synthetic edits (n_edits = {self.cfg.n_edits}; the edited documents' facts allow no more)")
    else:
        if not pathlib.Path(self.cfg.editing).exists():
            self.say(f"  editing: {self.cfg.editing} not found, skipped")
            return {"skipped": True}
        skipped: list[int] = []
        records, shots, style = load_zsre(self.cfg.editing, self.cfg.n_edits, skipped), ZSRE_SHOTS, "qa"
        if skipped:
            self.say(f"  editing: skipped records {skipped} of {self.cfg.editing}: empty edit target 'alt'")
    from memllm_jax.config import MEMORY_PRESETS

    memory_config = MEMORY_PRESETS.get(self.cfg.editing_memory)
    if memory_config is None:
        raise InputError(f"PipelineConfig.editing_memory must be one of {sorted(MEMORY_PRESETS)}, got "
                         f"{self.cfg.editing_memory!r}")
    res = evaluate_editing(self.model("mw"), self.model("mr"), self.tokenizer(), self.encoder(), records, shots=shots,
                           memory_config=memory_config, max_new_tokens=self.cfg.editing_max_new_tokens,
                           regimes=self.cfg.editing_regimes, style=style, **_edit_checks(self), progress=self.say)
    out = {k: v.to_json() for k, v in res.items()}
    # a ZsRE file's results sit next to the synthetic analogue's: `table3_<file stem>.*`
    stem = "table3" if self.cfg.editing == "synthetic" else "table3_" + pathlib.Path(self.cfg.editing).stem
    _save_json(self.out / "results" / f"{stem}.json", out)
    md = table3_markdown(out, "Table 3 analogue (ours, synthetic edits)" if self.cfg.editing == "synthetic"
                         else f"Table 3 (ours, {pathlib.Path(self.cfg.editing).name}, {len(records)} records)")
    atomic_write_text(self.out / "results" / f"{stem}.md", md + "\n")
    self.say(md)
    return {"regimes": list(out)}


def stage_scaling(self):
    from data_gen.gold_memory import gold_triples, unique_gold_triples
    from experiments.tables import plot_scaling, scaling_markdown
    from memllm_jax.eval.rows import ROWS
    from memllm_jax.eval.scaling import memory_growth, perplexity_vs_memory_size

    if not self.cfg.scaling_sizes and not self.cfg.growth_checkpoints:
        self.say("  no scaling sizes or growth checkpoints: skipped (earlier results kept)")
        return {"skipped": True}
    docs = self.eval_docs()
    base = unique_gold_triples(_documents(self, "eval"))  # in the gold memory's order: the +0 point is row ⑦
    base_set = set(base)
    distractors = sorted({t for doc in _documents(self, "train") for t in gold_triples(doc)} - base_set)
    random.Random(0).shuffle(distractors)
    points = []
    if self.cfg.scaling_sizes:
        pts = perplexity_vs_memory_size(self.model("mr"), self.tokenizer(), docs, self.encoder(), base, distractors,
                                        self.cfg.scaling_sizes, ROWS[self.cfg.scaling_row].read,
                                        batch_size=self.cfg.eval_batch, progress=self.say)
        points = [p.__dict__ for p in pts]
    growth = memory_growth(self.encoder(), base + distractors, self.cfg.growth_checkpoints)
    _save_json(self.out / "results" / "scaling.json", {"points": points, "growth": growth})
    md = scaling_markdown(points, growth)
    atomic_write_text(self.out / "results" / "scaling.md", md + "\n")
    plot_scaling(points, growth, self.out / "results" / "scaling.png")
    self.say(md)
    return {"points": len(points), "growth": len(growth)}


def stage_report(self):
    from experiments.tables import diagnostics_markdown, read_diagnostics_markdown

    res = self.out / "results"
    parts = [f"# MemLLM ({self.cfg.name}) results", "", f"Output directory: `{self.out}`", ""]

    def load(name):
        return json.loads((res / name).read_text()) if (res / name).exists() else None

    diag = diagnostics_markdown(load("corpus.json"), load("diagnostics.json"))
    if diag:
        parts += [diag, ""]
    for name in ("table2.md", *sorted(p.name for p in res.glob("table3*.md")), "scaling.md"):
        if (res / name).exists():
            parts += [(res / name).read_text(), ""]
        if name == "table2.md" and load("table2.json"):
            parts += [read_diagnostics_markdown(load("table2.json")), ""]
    for name in ("table2.png", "scaling.png"):
        if (res / name).exists():
            parts.append(f"![{name}]({name})")
    atomic_write_text(res / "report.md", "\n".join(parts) + "\n")
    self.say(f"report: {res / 'report.md'}")
    from experiments.report_html import build
    from experiments.tb_eval import log_results

    self.say(f"report: {build(self.out)}")
    log_results(self.out)
    return {}
