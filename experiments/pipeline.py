"""The main job's driver. Each stage (`experiments/stages.py`) writes its outputs under one directory plus a
`stages/<name>.json` stamp holding its key (`pipeline_config.stage_key`: a hash of the settings it depends on);
a stage whose stamp matches is skipped, so a run resumes where it stopped and a changed setting redoes exactly
the stages it affects.

Stages: corpus (synthesize or load, split train / outside / eval, build write / read / lm / eval examples) ->
tokenizer -> pretrain (tiny base; skipped with a pretrained base) -> mw and mr (LoRA adapters) -> memory (the
memory-write model writes the evaluation and outside documents) -> diagnostics -> table2 -> editing -> scaling ->
report (markdown, PNG, index.html). `Pipeline(cfg, out).run_stage(name)` runs one.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any, Callable

from experiments import stages
from experiments.pipeline_config import STAGES, PipelineConfig, resolve_host_settings, stage_key
from memllm_jax.files import atomic_write_json


def run_stage_in_process(cfg: PipelineConfig, out: str, name: str) -> None:
    """Run stage `name` of the pipeline in `out`, printing timed progress: a side process's entry point
    (`side_stage.SideStage`)."""
    t0 = time.perf_counter()
    Pipeline(cfg, out, say=lambda msg: print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)).run_stage(name)


class Pipeline:
    def __init__(self, cfg: PipelineConfig, out: str | pathlib.Path, say: Callable[[str], None] = print):
        self.cfg, self.out, self.say = resolve_host_settings(cfg, say), pathlib.Path(out), say
        self._cache: dict[str, Any] = {}

    # ------------------------------------------------------------------------------------------ driver

    def done(self, name: str) -> bool:
        stamp = self.out / "stages" / f"{name}.json"
        return stamp.exists() and json.loads(stamp.read_text()).get("key") == stage_key(self.cfg, name)

    def run_stage(self, name: str, force: bool = False) -> None:
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}; stages: {STAGES}")
        if self.done(name) and not force:
            self.say(f"[{name}] up to date, skipped")
            return
        t0 = time.perf_counter()
        self.say(f"[{name}] running")
        info = getattr(self, f"stage_{name}")() or {}
        seconds = time.perf_counter() - t0
        from memllm_jax.compiled_code import release_if_many_mappings
        from memllm_jax.train.host_memory import release_freed_memory

        release_freed_memory()  # `memllm run` keeps freed memory for reuse within a stage, not across stages
        release_if_many_mappings(self.say)
        atomic_write_json(self.out / "stages" / f"{name}.json", {"key": stage_key(self.cfg, name), "seconds": seconds, **info},
                          indent=1, default=str)
        self.say(f"[{name}] done in {seconds:.1f}s")

    def run(self, stages=STAGES) -> None:
        atomic_write_json(self.out / "config.json", dataclasses.asdict(self.cfg), indent=1, default=str)
        side = None
        try:
            for name in stages:
                if side is not None and name == side.name:
                    side.wait(self.say)
                    side = None
                    continue
                if name == "mw" and self.cfg.parallel_adapters and "mr" in stages and not self.done("mr"):
                    from experiments.side_stage import SideStage

                    side = SideStage(self.cfg, self.out, "mr", run_stage_in_process).start(self.say)
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

            self._cache["enc"] = load_encoder(self.cfg.encoder)
        return self._cache["enc"]

    def model(self, which: str):
        """"base", "mw", "mr" or "judge": the trained model, loaded once."""
        if which not in self._cache:
            from memllm_jax.model.load import load

            path = self.out / "train" / which
            if which == "base" and self.cfg.base_model:
                path = pathlib.Path(stages._base_dir(self))
            elif which == "base":
                path = self.out / "train" / "pretrain"
            model, _ = load(path, tokenizer=self.tokenizer())  # an HF base gets rows for the API markers
            if self.cfg.matmul_dtype is not None:  # the base too, so that every row multiplies alike
                from memllm_jax.model.mistral import set_matmul_dtype

                set_matmul_dtype(model, self.cfg.matmul_dtype)
            self._cache[which] = self._fit_context(model, which)
        return self._cache[which]

    def _fit_context(self, model, which: str):
        """Raise the model's context bound to the longest evaluation document plus room for a read (its weights
        do not depend on it; RoPE extrapolates to positions past the training length). Real corpora such as
        Re-DocRED have documents longer than the tiny model's 512 tokens."""
        import dataclasses as dc

        cfg = getattr(model, "cfg", None)
        if cfg is None or not (self.out / "data" / "eval" / "eval.jsonl").exists():
            return model
        need = max((len(d.ids) for d in self.eval_docs()), default=0) + 256
        if need > cfg.max_seq_len:
            self.say(f"  {which}: context bound raised from {cfg.max_seq_len} to {need} tokens for the longest evaluation document")
            model.cfg = dc.replace(cfg, max_seq_len=need)
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
    stage_judge = stages.stage_judge
    stage_memory = stages.stage_memory
    stage_diagnostics = stages.stage_diagnostics
    stage_table2 = stages.stage_table2
    stage_editing = stages.stage_editing
    stage_scaling = stages.stage_scaling
    stage_report = stages.stage_report
