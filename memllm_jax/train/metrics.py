"""Run observability: metrics as JSONL and TensorBoard event files, and a tqdm progress bar.

Only process 0 writes files and draws the bar. Every JSONL line is flushed as it is written, so a killed run
keeps its history; on resume the file is appended to (lines of steps past the resume point are dropped first,
so the history stays a function of the step).
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import jax

from memllm_jax.files import atomic_write_text
from memllm_jax.runtime.host_memory import process_memory_gb


class MetricsLogger:
    def __init__(self, workdir: str, *, total_steps: int, start_step: int = 0, progress: bool = True,
                 name: str = "train"):
        self.enabled = jax.process_index() == 0
        self.path = os.path.join(workdir, "metrics.jsonl")
        self.history: list[dict[str, Any]] = []
        self._file = self._tb = self._bar = None
        self._tokens_since, self._time_since = 0, time.perf_counter()
        self.tokens_per_s = 0.0
        self._memory: dict[str, float] = {}
        if not self.enabled:
            return
        os.makedirs(workdir, exist_ok=True)
        self.history = [r for r in _read(self.path) if r.get("step", 0) <= start_step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.history))
        self._file = open(self.path, "a")
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=start_step + 1 if start_step else None)
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc=name, unit="step", dynamic_ncols=True)

    def count_tokens(self, n: int) -> None:
        self._tokens_since += n

    def step(self, step: int, metrics: dict[str, float], *, write: bool) -> None:
        """Advance the bar to `step`; when `write`, also record a metrics line (with tokens/s since the last)."""
        if not self.enabled:
            return
        if write:
            now = time.perf_counter()
            self.tokens_per_s = self._tokens_since / max(now - self._time_since, 1e-9)
            self._tokens_since, self._time_since = 0, now
            self._memory = process_memory_gb()
            self.log(step, {**metrics, "tokens_per_s": self.tokens_per_s, **self._memory}, kind="train")
        if self._bar is not None:
            self._bar.update(step - self._bar.n)
            rss = {"rss": f"{self._memory['host_rss_gb']:.1f}G"} if "host_rss_gb" in self._memory else {}
            self._bar.set_postfix(loss=f"{metrics['loss']:.4f}", tok_s=f"{self.tokens_per_s:,.0f}", **rss, refresh=False)

    def log(self, step: int, metrics: dict[str, float], *, kind: str) -> None:
        if not self.enabled:
            return
        record = {"step": step, "kind": kind, "time": time.time(), **{k: _num(v) for k, v in metrics.items()}}
        self.history.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for k, v in metrics.items():
            if isinstance(v, (int, float)) and math.isfinite(v):
                self._tb.add_scalar(f"{kind}/{k}", v, step)
        if kind != "train":
            self.write(f"step {step} {kind}: " + " ".join(f"{k}={_fmt(v)}" for k, v in metrics.items()))

    def write(self, text: str) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
        self._tb.flush()
        self._tb.close()
        self._file.close()


def _num(v):
    v = float(v) if hasattr(v, "__float__") else v
    return v if not isinstance(v, float) or math.isfinite(v) else str(v)


def _fmt(v) -> str:
    return f"{v:.4f}" if isinstance(v, float) else str(v)


def _read(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill
    return out


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics.jsonl file."""
    return _read(path)
