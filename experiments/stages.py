"""The stages of `experiments.pipeline.Pipeline` (each a method taking the pipeline; returns stamp info)."""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
import random
import shutil

from experiments.pipeline_config import stage_key
from data_gen.recipes import ReadRecipe, WriteRecipe
from memllm_jax.errors import InputError, load_json
from memllm_jax.files import atomic_write_json, atomic_write_text


def _save_json(path: pathlib.Path, obj) -> None:
    """A stage's JSON output (results, splits), written atomically; values JSON lacks are written as text."""
    atomic_write_json(path, obj, indent=1, default=str)


def _labels(self):
    from data_gen.cli import labels_for

    if self.cfg.data.corpus == "synthetic":
        from data_gen.synthetic import synthetic_rel_info

        return synthetic_rel_info(self.cfg.data.phrase_relations)
    return labels_for(self.cfg.data.labels or None, self.cfg.data.corpus)


def _documents(self, split: str):
    from data_gen.docred import load_documents

    return load_documents(str(self.out / "data" / f"{split}.json"), _labels(self))


def _load_corpus_file(path: str, field: str) -> list:
    path = pathlib.Path(path)
    if not path.exists():
        raise InputError(f"{path}: corpus file not found (setting data.{field})")
    raw = load_json(path)
    if not isinstance(raw, list):
        raise InputError(f"{path}: expected a JSON array of DocRED-format documents (setting data.{field})")
    return raw


def stage_corpus(self):
    cfg, data = self.cfg.data, self.out / "data"
    n_eval, n_out = cfg.eval_docs, cfg.outside_docs
    if cfg.corpus == "synthetic" and cfg.heldout_world:
        from data_gen.synthetic import heldout_split

        train, heldout = heldout_split(cfg.synth_docs - n_eval - n_out, n_eval + n_out, seed=cfg.synth_seed,
                                       phrases=cfg.phrase_relations)
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
                                 f"{n_eval + n_out} (setting data.eval_corpus)")
            raw = raw + held[len(held) - n_eval - n_out:]
    if len(raw) <= n_eval + n_out:
        raise SystemExit(f"corpus has {len(raw)} documents; eval_docs + outside_docs = {n_eval + n_out} leaves none to train on")
    split = {"train": raw[: len(raw) - n_eval - n_out], "outside": raw[len(raw) - n_eval - n_out: len(raw) - n_eval],
             "eval": raw[len(raw) - n_eval:]}
    if cfg.train_docs:
        if not 0 < cfg.train_docs <= len(split["train"]):
            raise InputError(f"setting data.train_docs={cfg.train_docs}: the corpus leaves {len(split['train'])} "
                             "training documents")
        split["train"] = split["train"][: cfg.train_docs]
    for name, docs in split.items():
        _save_json(data / f"{name}.json", docs)
    _save_json(data / "rel_info.json", _labels(self))
    from data_gen.build import build_all

    labels = _labels(self)
    variants = (f" (with {cfg.write.counterfactual} / {cfg.read.counterfactual} counterfactual variants)"
                if cfg.write.counterfactual or cfg.read.counterfactual else "")
    self.say(f"  building write / read / lm examples from {len(split['train'])} training documents{variants}")
    st_train = build_all(str(data / "train.json"), str(data / "train"), labels, kinds={"write", "read", "lm"},
                         write=cfg.write, read=cfg.read, seed=cfg.synth_seed)
    self.say(f"  building eval records for {len(split['eval'])} held-out documents")
    plain_write, plain_read = WriteRecipe(evidence=cfg.write.evidence), ReadRecipe()  # held-out: the documents as they are
    build_all(str(data / "eval.json"), str(data / "eval"), labels, kinds={"eval", "write", "read"},
              write=plain_write, read=plain_read)
    if cfg.dev_corpus:  # the adapters' held-out examples (`_train`)
        dev = _load_corpus_file(cfg.dev_corpus, "dev_corpus")
        _save_json(data / "dev.json", dev)
        self.say(f"  building development write / read examples from {len(dev)} documents of {cfg.dev_corpus}")
        build_all(str(data / "dev.json"), str(data / "dev"), labels, kinds={"write", "read"}, write=plain_write,
                  read=plain_read)
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

    if self.cfg.base.model:  # a pretrained base brings its own tokenizer (the API markers are added to it)
        tok = load_tokenizer(_base_dir(self))
        tok.save(self.out / "tokenizer")
        self._cache.pop("tok", None)
        return {"base_model": self.cfg.base.model, "vocab_size": tok.vocab_size}

    # with the API examples included, relation names and `>>` get their own tokens, which shortens the
    # memory-write / memory-read spans by about a third
    texts = [seg["text"] for kind in self.cfg.tokenizer.texts
             for _, rec in read_jsonl(str(self.out / "data" / "train" / f"{kind}.jsonl")) for seg in rec["segments"]]
    train_tokenizer(texts, self.cfg.tokenizer.vocab_size, self.out / "tokenizer")
    self._cache.pop("tok", None)
    return {"texts": len(texts)}


def _train(self, section: str, recipe, data_file: str, init: str | None):
    """Train `recipe` (a `TrainConfig` without paths) on `data/train/<data_file>`, with the development file's
    examples as its held-out ones when the config has one."""
    from memllm_jax.train.loop import train

    data = self.out / "data"
    dev = data / "dev" / data_file
    cfg = dataclasses.replace(recipe, train_data=(str(data / "train" / data_file),),
                              eval_data=(str(dev),) if dev.exists() else recipe.eval_data,
                              tokenizer=str(self.out / "tokenizer"), workdir=str(_training_workdir(self, section)),
                              init_checkpoint=init)
    if self.cfg.compilation_cache is not None:  # the pipeline's cache (already enabled), not the recipe's own
        cfg = dataclasses.replace(cfg, compilation_cache=str(self.out.resolve().parent / self.cfg.compilation_cache))
    self.say(f"  training {section}: {cfg.name} -> {cfg.workdir}")
    result = train(cfg)
    if isinstance(result, dict):
        _count_training(self, cfg, result)
    return result if isinstance(result, dict) else {"result": str(result)}


def _count_training(self, cfg, result: dict) -> None:
    """The training's work (`roofline_table.Work.training`; `result`: `train`'s), of the model it exported (a
    pretrained base's shapes)."""
    from memllm_jax.checkpoint import read_stored

    model = read_stored(result["model_dir"]).model if result.get("model_dir") else cfg.model
    self.work.training(model, cfg.lora, steps=result.get("step", 0), batch=cfg.global_batch, seq_len=cfg.seq_len)
    self.work.missing("held-out evaluation during training (train/loop.py)")


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

    return str(resolve_model_dir(self.cfg.base.model))


def _base(self) -> str:
    return _base_dir(self) if self.cfg.base.model else str(self.out / "train" / "pretrain")


def stage_pretrain(self):
    if self.cfg.base.model:
        self.say(f"  base model: {self.cfg.base.model} (no pretraining)")
        return {"base_model": self.cfg.base.model}
    return _train(self, "pretrain", self.cfg.base.pretrain, "lm.jsonl", None)


def stage_mw(self):
    return _train(self, "mw", self.cfg.mw, "write.jsonl", _base(self))


def stage_mr(self):
    return _train(self, "mr", self.cfg.mr, "read.jsonl", _base(self))


DEVELOPMENT = "development"


def _min_confidence(self) -> float | None:
    """The memory stage's confidence threshold: the setting, or the one it chose on the development documents."""
    if self.cfg.write.min_confidence == DEVELOPMENT:
        chosen = self.out / "results" / "memory.json"
        if not chosen.exists():
            raise InputError(f"{chosen}: not found; write.min_confidence='development' is chosen by the memory stage: "
                             "run it first (memllm run --stage memory)")
        return json.loads(chosen.read_text())["min_confidence"]
    return self.cfg.write.min_confidence


def _write_decoding(self):
    """How the config's memory-write calls are decoded (the `write` settings; `decode.writer.WriteDecoding`)."""
    from memllm_jax.decode.writer import write_decoding

    w = self.cfg.write
    try:
        return write_decoding(self.tokenizer(), ban_repeats=w.ban_repeats, max_new_tokens=w.max_new_tokens,
                              late_stopping=w.late_stopping)
    except ValueError as exc:
        raise InputError(f"setting write.{exc}") from exc  # the field's name begins the message


def _write_budget(self, min_confidence: float | None) -> dict:
    """`write_corpus`'s settings for the config: its decoding, batching and checks (grounded triples name one of
    the corpus's relation labels)."""
    w = self.cfg.write
    return dict(decoding=_write_decoding(self), batch_size=w.batch, refill=w.refill, grounded=w.grounded,
                relations=_grounding_labels(self) if w.grounded else None, min_confidence=min_confidence,
                relation_phrases=self.cfg.data.phrase_relations)


def _grounding_labels(self) -> set[str]:
    """The relation names a grounded triple may have: the corpus's labels; with `data.phrase_relations` not the
    phrases, which are grounded by the focus sentence's words instead (`corpus_writer.is_grounded`)."""
    from data_gen.synth_world import PHRASE_RELATIONS

    return set(_labels(self).values()) - (set(PHRASE_RELATIONS) if self.cfg.data.phrase_relations else set())


def _edit_checks(self) -> dict:
    """How the edits of Table 3 are written: the memory stage's decoding with an edit's budget
    (`editing.EDIT_WRITE_TOKENS`), and its grounding and confidence checks when `editing.write_checks`."""
    from memllm_jax.eval.editing import EDIT_WRITE_TOKENS

    budget = _write_budget(self, _min_confidence(self))
    checks = ("grounded", "relations", "min_confidence") if self.cfg.editing.write_checks else ()
    return {"write_decoding": dataclasses.replace(budget["decoding"], max_new_tokens=EDIT_WRITE_TOKENS),
            **{k: budget[k] for k in checks}}


def _write_docs(self, mw, memory, docs, min_confidence: float | None, on_batch=None):
    """Write `docs` into `memory`, keeping the triples written with at least `min_confidence`."""
    from memllm_jax.decode.corpus_writer import write_corpus

    stats = write_corpus(mw, self.tokenizer(), memory, docs, on_batch=on_batch, **_write_budget(self, min_confidence))
    _count_writes(self, mw, docs, stats)
    return stats


def _count_writes(self, mw, docs, stats) -> None:
    """The work of writing `docs` (`roofline_table.Work.writes`): their write prompts, encoded again as
    `write_corpus` encodes them (its default pretext and prompt bound), and the tokens it generated. Nothing is
    counted outside a `Pipeline` (no `work`) or for a model without a `ModelConfig` (a test's scripted model)."""
    from memllm_jax.decode.corpus_writer import as_write_document, iter_write_prompts

    if getattr(self, "work", None) is None or not hasattr(mw, "cfg"):
        return
    tok = self.tokenizer()
    prompts = [ids for k, doc in enumerate(docs) for _, ids in iter_write_prompts(as_write_document(doc, k), tok)]
    self.work.writes(mw.cfg, prompts, stats.tokens, self.cfg.write.batch)


def _write_eval(self, mw, eval_docs, min_confidence: float | None, on_batch=None, log: pathlib.Path | None = None):
    """The memory-write model `mw` writes the evaluation documents into a new memory: `(memory, info)`, info with
    the write statistics and the agreement with the documents' gold triples (precision / recall / F1, by name,
    and by entity under "entity_level": `eval.write_quality`). `log`: a JSON-lines file of every triple written,
    its sentence, whether it is gold (by name), what the checks made of it and the confidence it was kept or dropped
    by (null when no confidence was checked)."""
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
    if self.cfg.write.grounded:
        info["ungrounded"] = len(st.ungrounded)
        info["before_grounding"] = write_agreement(kept + st.unconfident + st.ungrounded, gold)
    if min_confidence is not None:
        info["unconfident"] = len(st.unconfident)
        info["before_confidence"] = write_agreement(kept + st.unconfident, gold)
    if log is not None:
        gold_keys = {triple_key(t) for t in gold}
        confidence = {(source, t): c for source, t, c in st.scored if c > -float("inf")}
        atomic_write_text(log, "".join(json.dumps({"source": source, "subject": t.subject, "relation": t.relation,
                                              "object": t.object, "fate": fate, "gold": triple_key(t) in gold_keys,
                                              "confidence": confidence.get((source, t))})
                                  + "\n" for source, t, fate in st.written))
    return mem, info


def _choose_min_confidence(self, mw, outside, on_batch) -> tuple[float, dict, list]:
    """Write the outside documents keeping every grounded triple with its confidence, and choose the threshold
    with the highest F1 against their gold triples among `write.confidence_grid` and None (keep every triple, so
    the choice is never worse on them than no threshold): `(threshold, report, [scored writes of the quarter, of
    the rest])`, the scored writes to fill rows ② / ① at that threshold without decoding again."""
    from data_gen.gold_memory import gold_triples
    from memllm_jax.decode.corpus_writer import write_corpus
    from memllm_jax.eval.write_quality import choose_min_confidence, threshold_label
    from memllm_jax.memory import TripleMemory

    if not outside:
        raise InputError(f'setting write.min_confidence="{DEVELOPMENT}": needs outside documents '
                         "(data.outside_docs > 0) to choose the threshold on")
    quarter, scored = max(1, len(outside) // 4), []
    for docs in (outside[:quarter], outside[quarter:]):
        scratch = TripleMemory(self.encoder())
        st = write_corpus(mw, self.tokenizer(), scratch, docs, on_batch=on_batch,
                          **_write_budget(self, -float("inf")))
        _count_writes(self, mw, docs, st)
        scored.append(st.scored)
    gold = [t for d in outside for t in gold_triples(d)]
    threshold, rows = choose_min_confidence([(t, c) for part in scored for _, t, c in part], gold,
                                            tuple(self.cfg.write.confidence_grid) + (None,))
    report = {"documents": len(outside), "rule": "highest F1", "candidates": rows}
    for r in rows:
        self.say(f"  development, confidence >= {threshold_label(r['min_confidence'])}: precision {r['precision']:.3f} "
                 f"recall {r['recall']:.3f} f1 {r['f1']:.3f}")
    self.say(f"  confidence threshold chosen on the {len(outside)} outside documents: {threshold}")
    return threshold, report, scored


def stage_memory(self):
    from data_gen.gold_memory import fill_memory
    from memllm_jax.decode.corpus_writer import write_scored
    from memllm_jax.memory import TripleMemory

    enc, mw, info = self.encoder(), self.model("mw"), {}
    eval_docs = _documents(self, "eval")
    outside = _documents(self, "outside") if self.cfg.data.outside_docs else []
    gold = TripleMemory(enc)
    info["gold_triples"] = fill_memory(gold, eval_docs)
    gold.save(self.out / "memory" / "gold")

    def on_batch(stats, finished):
        if finished:
            self.say(f"  memory write: {stats.documents} documents, {stats.sentences} sentences, {stats.triples} triples")

    scored = None
    if self.cfg.write.min_confidence == DEVELOPMENT:
        info["min_confidence"], info["development"], scored = _choose_min_confidence(self, mw, outside, on_batch)
    else:
        info["min_confidence"] = self.cfg.write.min_confidence
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

    taught = taught_triples(eval_docs, evidence=self.cfg.data.write.evidence)
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
        info[which] = field_losses(self.model(which), tok, records, batch_size=self.cfg.diagnostics.batch,
                                   max_records=self.cfg.diagnostics.examples)
        self.work.forwards(self.model(which).cfg, [1 + sum(len(tok.encode(seg["text"])) for seg in rec["segments"])
                                                   for rec in records[:self.cfg.diagnostics.examples]])
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
    from memllm_jax.eval.perplexity import evaluate_perplexity, read_scorer
    from memllm_jax.eval.rows import get_rows

    cfg = self.cfg.table2
    if not cfg.rows:
        self.say("  no rows selected: skipped (earlier results kept)")
        return {"skipped": True}
    # rows evaluated earlier (e.g. one row per sweep point) are kept; the rows run now replace theirs
    path = self.out / "results" / "table2.json"
    docs, tok = self.eval_docs(), self.tokenizer()
    results = {k: v for k, v in (json.loads(path.read_text()) if path.exists() else {}).items() if k not in cfg.rows}
    scorers = {}
    for row in get_rows(cfg.rows):
        if row.memory.startswith("mw_outside") and not self.cfg.data.outside_docs:
            self.say(f"  {row.name}: skipped (outside_docs = 0)")
            continue
        memory = None if row.memory == "none" else self.memory(row.memory)
        which = "base" if row.model == "base" else "mr"
        model = self.model(which)
        if which not in scorers:  # one per model: each shape compiled and the plain forward run once
            scorers[which] = read_scorer(model, tok, cfg.batch)
        setting = row.read
        if setting.positions == "model" and cfg.read_threshold is not None:
            setting = dataclasses.replace(setting, read_threshold=cfg.read_threshold)
        res = evaluate_perplexity(model, tok, docs, memory, setting, batch_size=cfg.batch,
                                  query_batch=cfg.query_batch, progress=self.say, trace_docs=TRACE_DOCS,
                                  scorer=scorers[which])
        self.work.model_work(model.cfg, res.work, cfg.query_batch)
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


def _uses_edit_world(self) -> bool:
    """The Table 3 analogue edits a third world's facts: the synthetic corpus with its held-out world."""
    return self.cfg.data.corpus == "synthetic" and self.cfg.data.heldout_world


def _edit_world(self):
    """The Table 3 analogue's edit world (`data_gen.synthetic.edit_world`: no name of the corpus, 2 documents per
    edit) and its documents."""
    from data_gen.docred import documents_from_raw
    from data_gen.overlap import heldout_overlap
    from data_gen.synthetic import edit_world, iter_synthetic

    splits = ("train", "eval", "outside") if self.cfg.data.outside_docs else ("train", "eval")
    corpus = [d for split in splits for d in _documents(self, split)]
    names = {m.text for d in corpus for e in d.entities for m in e.full_mentions}
    n_docs = 2 * self.cfg.editing.n_edits
    world = edit_world(n_docs, self.cfg.data.synth_seed, names, phrases=self.cfg.data.phrase_relations)
    docs = list(documents_from_raw(iter_synthetic(n_docs, world=world), _labels(self), source="edit world"))
    overlap = heldout_overlap(corpus, docs, [])
    self.say(f"  editing: {len(docs)} edit-world documents; their facts stated in the corpus: "
             f"{overlap['triples_in_train']:.3f}")
    return world, docs


def _synthetic_edit_records(self, absent: list | None = None, docs: list | None = None) -> list:
    """The Table 3 analogue's edits, at most one per subject and kind of answer. With a held-out world they are
    drawn from the edit world's documents (`docs`, or `_edit_world`'s); otherwise from the evaluation and outside
    documents' facts. `absent`: extended by `editing.absent_questions` questions about the same documents' facts
    that no edit touches (`data_gen.edits.absent_questions`)."""
    from data_gen.edits import absent_questions, synthetic_edits
    from data_gen.gold_memory import gold_triples

    if docs is None and _uses_edit_world(self):
        docs = _edit_world(self)[1]
    elif docs is None:
        docs = [d for split in ("eval", "outside")[: 2 if self.cfg.data.outside_docs else 1]
                for d in _documents(self, split)]
    kinds = {e.name: e.type for d in docs for e in d.entities}
    gold = [t for d in docs for t in gold_triples(d)]
    records = synthetic_edits(gold, self.cfg.editing.n_edits, object_kinds=kinds)
    if absent is not None:
        absent += absent_questions(gold, records, self.cfg.editing.absent_questions)
    return records


def _phrase_edit_records(self, world) -> dict[str, list]:
    """Phrase-relation edits of the edit world (`data_gen.edits.phrase_edits`), the held-out phrases' and the
    training phrases', `editing.n_edits` at most each."""
    from data_gen.edits import phrase_edits
    from data_gen.synth_world import HELDOUT_PHRASES, PHRASE_RELATIONS, TRAIN_PHRASES
    from data_gen.synthetic import phrase_triples

    every = phrase_triples(world, PHRASE_RELATIONS)
    return {kind: phrase_edits(phrase_triples(world, phrases), self.cfg.editing.n_edits, self.cfg.data.synth_seed,
                               loc_triples=every)
            for kind, phrases in (("heldout", sorted(HELDOUT_PHRASES)), ("seen", TRAIN_PHRASES))}


def stage_editing(self):
    from experiments.tables import table3_markdown
    from memllm_jax.config import MEMORY_PRESETS
    from memllm_jax.eval.editing import EDIT_BATCH, ZSRE_SHOTS, evaluate_editing, load_zsre
    from memllm_jax.eval.scoring import ModelWork

    cfg = self.cfg.editing
    if not cfg.records:
        return {"skipped": True}
    absent: list = []
    phrase_records: dict[str, list] = {}
    if cfg.records == "synthetic":
        world, docs = _edit_world(self) if _uses_edit_world(self) else (None, None)
        records, shots, style = _synthetic_edit_records(self, absent, docs), (), "cloze"
        if self.cfg.data.phrase_relations:
            phrase_records = _phrase_edit_records(self, world)
        if len(records) < cfg.n_edits:
            self.say(f"  editing: {len(records)} synthetic edits (n_edits = {cfg.n_edits}; the edited documents' facts allow no more)")
    else:
        if not pathlib.Path(cfg.records).exists():
            raise InputError(f"{cfg.records}: not found (setting editing.records)")
        skipped: list[int] = []
        records, shots, style = load_zsre(cfg.records, cfg.n_edits, skipped), ZSRE_SHOTS, "qa"
        if skipped:
            self.say(f"  editing: skipped records {skipped} of {cfg.records}: empty edit target 'alt'")
        if cfg.absent_questions:
            self.say("  editing: absent_questions asks about the synthetic edits' world only: none asked")
    work = ModelWork()
    res = evaluate_editing(self.model("mw"), self.model("mr"), self.tokenizer(), self.encoder(), records, shots=shots,
                           memory_config=MEMORY_PRESETS[cfg.memory], max_new_tokens=cfg.max_new_tokens,
                           regimes=cfg.regimes, style=style, **_edit_checks(self), absent=absent,
                           keep_empty=cfg.keep_empty, progress=self.say, work=work)
    out = {k: v.to_json() for k, v in res.items()}
    # a ZsRE file's results sit next to the synthetic analogue's: `table3_<file stem>.*`
    stem = "table3" if cfg.records == "synthetic" else "table3_" + pathlib.Path(cfg.records).stem
    _save_json(self.out / "results" / f"{stem}.json", out)
    md = table3_markdown(out, "Table 3 analogue (ours, synthetic edits)" if cfg.records == "synthetic"
                         else f"Table 3 (ours, {pathlib.Path(cfg.records).name}, {len(records)} records)")
    atomic_write_text(self.out / "results" / f"{stem}.md", md + "\n")
    self.say(md)
    for kind, precs in phrase_records.items():
        title = {"heldout": "held-out relations: no training document states them",
                 "seen": "relations the training documents state, about edit-world subjects"}[kind]
        res = evaluate_editing(self.model("mw"), self.model("mr"), self.tokenizer(), self.encoder(), precs,
                               memory_config=MEMORY_PRESETS[cfg.memory], max_new_tokens=cfg.max_new_tokens,
                               regimes=("sequential",), style="cloze", **_edit_checks(self), keep_empty=cfg.keep_empty,
                               progress=self.say, work=work)
        out = {k: v.to_json() for k, v in res.items()}
        _save_json(self.out / "results" / f"table3_phrases_{kind}.json", out)
        md = table3_markdown(out, f"Relations outside the label set ({len(precs)} phrase-relation edits, {title})",
                             beyond_paper="it writes and reads only its 96 relation types")
        atomic_write_text(self.out / "results" / f"table3_phrases_{kind}.md", md + "\n")
        self.say(md)
    self.work.model_work(self.model("mr").cfg, work, EDIT_BATCH)
    return {"regimes": list(out)}


def stage_scaling(self):
    from data_gen.gold_memory import gold_triples, unique_gold_triples
    from experiments.tables import plot_scaling, scaling_markdown
    from memllm_jax.eval.rows import ROWS
    from memllm_jax.eval.scaling import memory_growth, perplexity_vs_memory_size
    from memllm_jax.eval.scoring import ModelWork

    cfg = self.cfg.scaling
    if not cfg.sizes and not cfg.growth_checkpoints:
        self.say("  no scaling sizes or growth checkpoints: skipped (earlier results kept)")
        return {"skipped": True}
    docs = self.eval_docs()
    base = unique_gold_triples(_documents(self, "eval"))  # in the gold memory's order: the +0 point is row ⑦
    base_set = set(base)
    distractors = sorted({t for doc in _documents(self, "train") for t in gold_triples(doc)} - base_set)
    random.Random(0).shuffle(distractors)
    points = []
    if cfg.sizes:
        work = ModelWork()
        pts = perplexity_vs_memory_size(self.model("mr"), self.tokenizer(), docs, self.encoder(), base, distractors,
                                        cfg.sizes, ROWS[cfg.row].read, batch_size=cfg.batch, progress=self.say,
                                        work=work)
        points = [p.__dict__ for p in pts]
        self.work.model_work(self.model("mr").cfg, work, cfg.batch)
    growth = memory_growth(self.encoder(), base + distractors, cfg.growth_checkpoints)
    _save_json(self.out / "results" / "scaling.json", {"points": points, "growth": growth})
    md = scaling_markdown(points, growth)
    atomic_write_text(self.out / "results" / "scaling.md", md + "\n")
    plot_scaling(points, growth, self.out / "results" / "scaling.png")
    self.say(md)
    return {"points": len(points), "growth": len(growth)}


def stage_two_hop(self):
    from data_gen.gold_memory import fill_memory, gold_triples
    from data_gen.two_hop import two_hop_questions
    from experiments.tables import two_hop_markdown
    from memllm_jax.eval.scoring import ModelWork
    from memllm_jax.eval.two_hop import evaluate_two_hop
    from memllm_jax.memory import TripleMemory

    cfg = self.cfg.two_hop
    if not cfg.questions:
        return {"skipped": True}
    docs = _documents(self, "eval")
    questions = two_hop_questions([t for d in docs for t in gold_triples(d)], cfg.questions, self.cfg.data.synth_seed)
    memory = TripleMemory(self.encoder())
    n = fill_memory(memory, docs)
    self.say(f"  two-hop: {len(questions)} questions; the memory holds the {n} one-hop facts of the evaluation documents")
    work = ModelWork()
    res = evaluate_two_hop(self.model("mr"), self.tokenizer(), memory, TripleMemory(self.encoder()), questions,
                           max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch,
                           keep_reads=self.cfg.data.read.keep_reads, progress=self.say, work=work)
    self.work.model_work(self.model("mr").cfg, work, cfg.batch)
    out = res.to_json()
    _save_json(self.out / "results" / "two_hop.json", out)
    md = two_hop_markdown(out)
    atomic_write_text(self.out / "results" / "two_hop.md", md + "\n")
    self.say(md)
    return {"questions": len(questions)}


def stage_report(self):
    from experiments.tables import results_tables

    res = self.out / "results"
    parts = [f"# MemLLM ({self.cfg.name}) results", "", f"Output directory: `{self.out}`", ""]
    for block in results_tables(res):
        parts += [block, ""]
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
