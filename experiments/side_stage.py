"""Run one pipeline stage in a second process while the main process runs another.

The memory-write and memory-read adapters both start from the trained base and do not depend on each other,
so the main job trains them at the same time (`PipelineConfig.parallel_adapters`). A single training process
leaves part of a 2-core CPU idle (the host-side input pipeline, small ops that run on one thread), so two
trainings side by side finish sooner than one after the other.

The second process is started with `spawn` (forking a process that has initialised JAX is unsafe). Its
output goes to a log file; the main process reports its progress from its `metrics.jsonl` and raises with the
log's tail if it fails. The stage writes its own stamp, exactly as when run in the main process.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pathlib
import sys
import time
from typing import Any, Callable


def _child(run: Callable[[Any, str, str], None], cfg, out: str, name: str, log_path: str) -> None:
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    os.environ["TQDM_DISABLE"] = "1"  # no progress bar in a log file; the main process reports progress
    run(cfg, out, name)


class SideStage:
    """`SideStage(cfg, out, "mr", run).start(say)`, later `.wait(say)` (reports progress, raises on failure).
    `run(cfg, out, name)` runs the stage; a module-level function (`pipeline.run_stage_in_process`), since the
    second process is spawned and receives it pickled."""

    def __init__(self, cfg, out: pathlib.Path, name: str, run: Callable[[Any, str, str], None]):
        self.cfg, self.out, self.name, self.run = cfg, pathlib.Path(out), name, run
        self.log_path = self.out / "logs" / f"{name}.log"
        self._proc = None
        self._t0 = 0.0

    def start(self, say: Callable[[str], None]) -> "SideStage":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        ctx = multiprocessing.get_context("spawn")
        self._proc = ctx.Process(target=_child, args=(self.run, self.cfg, str(self.out), self.name, str(self.log_path)),
                                 name=f"memllm-{self.name}", daemon=True)
        self._t0 = time.perf_counter()
        self._proc.start()
        say(f"[{self.name}] running in a second process (log: {self.log_path})")
        return self

    def progress(self) -> str:
        """The side training's last logged step, from its metrics file ("" before the first)."""
        path = self.out / "train" / self.name / "metrics.jsonl"
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

    def wait(self, say: Callable[[str], None], every: float = 20.0) -> None:
        assert self._proc is not None, "start() first"
        while self._proc.is_alive():
            self._proc.join(timeout=every)
            if self._proc.is_alive():
                say(f"[{self.name}] second process: {self.progress() or 'starting'}")
        seconds = time.perf_counter() - self._t0
        if self._proc.exitcode != 0:
            tail = self.log_path.read_text().splitlines()[-20:] if self.log_path.exists() else []
            raise RuntimeError(f"stage {self.name!r} failed in its second process (exit code {self._proc.exitcode}); "
                               f"last lines of {self.log_path}:\n" + "\n".join(tail))
        say(f"[{self.name}] done in {seconds:.1f}s (second process)")

    def stop(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=10)
