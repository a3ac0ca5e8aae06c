"""Run a job in a second process while the main process runs another.

A single training process leaves part of a 2-core CPU idle (the host-side input pipeline, small ops that run on
one thread), so two independent jobs side by side finish sooner than one after the other there; on an
accelerator the two would compete for the device (`runtime.parallel_adapters_available` says when it pays).

The second process is started with `spawn` (forking a process that has initialised JAX is unsafe). Its output
goes to a log file; `wait` reports the job's progress through a callable and raises with the log's tail if the
job fails.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import sys
import time
from typing import Any, Callable


def _child(target: Callable[..., Any], args: tuple, log_path: str) -> None:
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    os.environ["TQDM_DISABLE"] = "1"  # no progress bar in a log file; the main process reports progress
    target(*args)


class SideProcess:
    """`SideProcess(name, target, args, log_path).start(say)`, later `.wait(say, progress)` (reports progress,
    raises on failure). `target(*args)` runs the job; a module-level function, since the second process is
    spawned and receives it and its arguments pickled."""

    def __init__(self, name: str, target: Callable[..., Any], args: tuple, log_path: str | pathlib.Path):
        self.name, self.target, self.args, self.log_path = name, target, tuple(args), pathlib.Path(log_path)
        self._proc = None
        self._t0 = 0.0

    def start(self, say: Callable[[str], None]) -> "SideProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        ctx = multiprocessing.get_context("spawn")
        self._proc = ctx.Process(target=_child, args=(self.target, self.args, str(self.log_path)),
                                 name=f"memllm-{self.name}", daemon=True)
        self._t0 = time.perf_counter()
        self._proc.start()
        say(f"[{self.name}] running in a second process (log: {self.log_path})")
        return self

    def wait(self, say: Callable[[str], None], progress: Callable[[], str] = lambda: "", every: float = 20.0) -> None:
        """Block until the job ends, saying `progress()` every `every` seconds ("starting" while it is empty);
        raise RuntimeError with the log's last lines when the job failed."""
        assert self._proc is not None, "start() first"
        while self._proc.is_alive():
            self._proc.join(timeout=every)
            if self._proc.is_alive():
                say(f"[{self.name}] second process: {progress() or 'starting'}")
        seconds = time.perf_counter() - self._t0
        if self._proc.exitcode != 0:
            tail = self.log_path.read_text().splitlines()[-20:] if self.log_path.exists() else []
            raise RuntimeError(f"{self.name!r} failed in its second process (exit code {self._proc.exitcode}); "
                               f"last lines of {self.log_path}:\n" + "\n".join(tail))
        say(f"[{self.name}] done in {seconds:.1f}s (second process)")

    def stop(self) -> None:
        if self._proc is not None and self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=10)
