"""The main job's driver. Each stage (`experiments/stages.py`) writes its outputs under one directory plus a
`stages/<name>.json` stamp holding its key (`pipeline_config.stage_key`: a hash of the settings it depends on);
a stage whose stamp matches is skipped, so a run resumes where it stopped and a changed setting redoes exactly
the stages it affects.

Stages: corpus (synthesize or load, split train / outside / eval, build write / read / lm / eval examples) ->
tokenizer -> pretrain (tiny base; skipped with a pretrained base) -> mw and mr (LoRA adapters) -> memory (the
memory-write model writes the evaluation and outside documents) -> diagnostics -> table2 -> editing -> scaling ->
report (markdown, PNG, index.html). `Pipeline(cfg, out).run_stage(name)` runs one.

What the host needs besides (freed memory kept for reuse, released between stages; the memory-read adapter
trained in a second process while the memory-write adapter trains) the runtime decides (`memllm_jax.runtime`);
a config can only turn it off (`keeps_freed_memory`, `trains_adapters_in_parallel`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any, Callable

from experiments import roofline_table, stages
from experiments.pipeline_config import (STAGES, PipelineConfig, changed_settings, resolve_host_settings,
                                        stage_key, stage_settings)
from memllm_jax import runtime
from memllm_jax.bench.host import describe
from memllm_jax.files import atomic_write_json

# ------------------------------------------------------------------ the runtime's choices, as a config limits them


def trains_adapters_in_parallel(cfg: PipelineConfig) -> bool:
    """Whether the memory-read adapter trains in a second process while the memory-write adapter trains (both
    start from the base): where the runtime says two trainings side by side pay, for a tiny base pretrained here
    (two processes of a pretrained base's size compete for memory and bandwidth, and gain nothing)."""
    return not cfg.base.model and runtime.parallel_adapters_available()


# ------------------------------------------------------------------------------------ the second process


def run_stage_in_process(cfg: PipelineConfig, out: str, name: str) -> None:
    """Run stage `name` of the pipeline in `out`, printing timed progress: the second process's entry point
    (`side_stage`); the stage writes its own stamp, exactly as when run in the main process."""
    t0 = time.perf_counter()
    Pipeline(cfg, out, say=lambda msg: print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)).run_stage(name)


def side_stage(cfg: PipelineConfig, out: str | pathlib.Path, name: str) -> runtime.SideProcess:
    """Stage `name` as a job for a second process (`runtime.SideProcess`; its output in `out/logs/<name>.log`)."""
    out = pathlib.Path(out)
    return runtime.SideProcess(name, run_stage_in_process, (cfg, str(out), name), out / "logs" / f"{name}.log")


def training_progress(out: str | pathlib.Path, name: str) -> str:
    """A training stage's last logged step, from its metrics file ("" before the first)."""
    path = pathlib.Path(out) / "train" / name / "metrics.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:  # a line being written
            continue
        if rec.get("kind") == "train":
            return f"step {rec['step']}, loss {rec.get('loss', float('nan')):.3f}"
    return ""


class Pipeline:
    def __init__(self, cfg: PipelineConfig, out: str | pathlib.Path, say: Callable[[str], None] = print):
        self.cfg, self.out, self.say = resolve_host_settings(cfg, say), pathlib.Path(out), say
        self._cache: dict[str, Any] = {}
        self.work = roofline_table.Work()  # what the running stage computed (`roofline_table`)
        self._ceilings: dict | None = None

    # ------------------------------------------------------------------------------------------ driver

    def _stamp(self, name: str) -> dict | None:
        stamp = self.out / "stages" / f"{name}.json"
        return json.loads(stamp.read_text()) if stamp.exists() else None

    def done(self, name: str) -> bool:
        stamp = self._stamp(name)
        return stamp is not None and stamp.get("key") == stage_key(self.cfg, name)

    def run_stage(self, name: str, force: bool = False) -> None:
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages: {tuple(STAGES)}")
        if self.done(name) and not force:
            self.say(f"[{name}] up to date, skipped")
            return
        stamp = self._stamp(name)
        if stamp is not None and not force:  # say in one line why a finished stage runs again
            if "settings" in stamp:
                changed = changed_settings(stamp["settings"], stage_settings(self.cfg, name))
                self.say(f"[{name}] settings changed since its last run: {'; '.join(changed) or 'an upstream stage'}")
            else:
                self.say(f"[{name}] stamped by an older version of the pipeline: running again")
        self.compilation_cache_dir()
        t0 = time.perf_counter()
        self.say(f"[{name}] running")
        self.work = roofline_table.Work()
        with roofline_table.CompileClock() as compiling:
            info = getattr(self, f"stage_{name}")() or {}
        seconds = time.perf_counter() - t0
        runtime.after_stage(self.say)  # e.g. freed memory is kept for reuse within a stage, not across stages
        work = self.work.to_json(compiling.seconds)
        atomic_write_json(self.out / "stages" / f"{name}.json",
                          {"key": stage_key(self.cfg, name), "seconds": seconds, **info, "work": work,
                           "settings": stage_settings(self.cfg, name)}, indent=1, default=str)
        self.say(f"[{name}] done in {seconds:.1f}s")
        self._roofline(name, seconds, work)

    def compilation_cache_dir(self) -> str | None:
        """JAX's persistent cache, enabled before the first stage compiles anything (`cfg.compilation_cache`);
        its directory, or None when the config turns it off."""
        if self.cfg.compilation_cache is None:
            return None
        if "xla_cache" not in self._cache:
            from memllm_jax import compilation_cache  # imports jax: not at `memllm run --help`

            self._cache["xla_cache"] = compilation_cache.enable(self.out.resolve().parent / self.cfg.compilation_cache)
        return self._cache["xla_cache"]

    def _roofline(self, name: str, seconds: float, work: dict) -> None:
        """Print the stage's roofline line and rewrite `results/roofline.json` from every stamp; the host's
        ceilings are read (or measured once per host) when a stage first has work to hold against them."""
        dtype = self.cfg.matmul_dtype or "float32"

        def ceilings():
            if self._ceilings is None:
                self._ceilings = roofline_table.host_ceilings(dtype)
            return self._ceilings

        row = roofline_table.stage_row(name, seconds, work, ceilings() if roofline_table.needs_ceilings(work) else None)
        self.say(roofline_table.row_line(row))
        atomic_write_json(self.out / "results" / "roofline.json", roofline_table.run_table(self.out, dtype, ceilings),
                          indent=1)

    def run(self, stages=tuple(STAGES)) -> None:
        atomic_write_json(self.out / "config.json", dataclasses.asdict(self.cfg), indent=1, default=str)
        atomic_write_json(self.out / "host.json", {**describe(), "matmul_dtype": self.cfg.matmul_dtype}, indent=1)
        side = None
        try:
            for name in stages:
                if side is not None and name == side.name:
                    side.wait(self.say, lambda: training_progress(self.out, side.name))
                    side = None
                    continue
                if name == "mw" and trains_adapters_in_parallel(self.cfg) and "mr" in stages and not self.done("mr"):
                    side = side_stage(self.cfg, self.out, "mr").start(self.say)
                self.run_stage(name)
        finally:
            if side is not None:  # the main process failed first
                side.stop()

    # lazily loaded artefacts --------------------------------------------------------------------------

    def tokenizer(self):
        if "tok" not in self._cache:
            from memllm_jax.tokenizer import load_tokenizer

            self._cache["tok"] = load_tokenizer(self.out / "tokenizer")
        return self._cache["tok"]

    def encoder(self):
        if "enc" not in self._cache:
            from memllm_jax.memory import load_encoder

            self._cache["enc"] = load_encoder(self.cfg.write.encoder)
        return self._cache["enc"]

    def model(self, which: str):
        """"base", "mw" or "mr": the trained model, loaded once, its layers scanned (`stack_layers`: the evaluations
        compile one block per shape, whatever layout it was trained in)."""
        if which not in self._cache:
            from memllm_jax.model.decoder import Decoder, set_matmul_dtype, stack_layers
            from memllm_jax.model.load import load

            path = self.out / "train" / which
            if which == "base" and self.cfg.base.model:
                path = pathlib.Path(stages._base_dir(self))
            elif which == "base":
                path = self.out / "train" / "pretrain"
            model, _ = load(path, tokenizer=self.tokenizer())  # an HF base gets rows for the API markers
            if self.cfg.matmul_dtype is not None:  # the base too, so that every row multiplies alike
                set_matmul_dtype(model, self.cfg.matmul_dtype)
            if isinstance(model, Decoder):
                stack_layers(model)
            self._cache[which] = self._fit_context(model, which)
        return self._cache[which]

    def _fit_context(self, model, which: str):
        """Raise the model's context bound to the longest evaluation document plus room for a read (its weights
        do not depend on it; RoPE extrapolates to positions past the training length). Real corpora such as
        Re-DocRED have documents longer than the tiny model's 512 tokens."""
        cfg = getattr(model, "cfg", None)
        if cfg is None or not (self.out / "data" / "eval" / "eval.jsonl").exists():
            return model
        need = max((len(d.ids) for d in self.eval_docs()), default=0) + 256
        if need > cfg.max_seq_len:
            self.say(f"  {which}: context bound raised from {cfg.max_seq_len} to {need} tokens for the longest evaluation document")
            model.cfg = dataclasses.replace(cfg, max_seq_len=need)
        return model

    def eval_docs(self):
        if "docs" not in self._cache:
            from memllm_jax.eval.records import encode_documents, load_eval_docs

            self._cache["docs"] = encode_documents(self.tokenizer(), load_eval_docs(self.out / "data" / "eval" / "eval.jsonl"))
        return self._cache["docs"]

    def memory(self, which: str):
        from memllm_jax.memory import TripleMemory

        return TripleMemory.open(self.out / "memory" / which, self.encoder())

    # stages (experiments/stages.py) -------------------------------------------------------------------

    stage_corpus = stages.stage_corpus
    stage_tokenizer = stages.stage_tokenizer
    stage_pretrain = stages.stage_pretrain
    stage_mw = stages.stage_mw
    stage_mr = stages.stage_mr
    stage_memory = stages.stage_memory
    stage_diagnostics = stages.stage_diagnostics
    stage_table2 = stages.stage_table2
    stage_editing = stages.stage_editing
    stage_scaling = stages.stage_scaling
    stage_two_hop = stages.stage_two_hop
    stage_report = stages.stage_report
