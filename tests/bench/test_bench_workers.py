"""`bench.workers`: each contender in its own spawned process, timed there, rotated as `timing.interleaved`, and
no worker left behind (after success, a failing factory or step, a dead worker, or Ctrl-C)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

import psutil
import pytest

import bench_worker_contenders as C
from memllm_jax.bench.workers import Spec, WorkerError, Workers, interleaved_in_workers


def _worker_processes() -> list[psutil.Process]:
    """This process's spawned workers still alive (not multiprocessing's long-lived resource tracker)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "spawn_main" in " ".join(p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.fixture(autouse=True)
def no_workers_left():
    yield
    assert multiprocessing.active_children() == []
    assert _worker_processes() == []


def test_each_contender_runs_in_its_own_process_rotated_and_timed_there(tmp_path):
    log = str(tmp_path / "order.log")
    env = {"BENCH_WORKER_TEST": "yes"}
    specs = {"A": Spec(C.logged_sleep, (log, "A", 0.05, "BENCH_WORKER_TEST"), env=env, setup=C.record_pid),
             "B": Spec(C.logged_sleep, (log, "B", 0.0), {"env_var": ""}, setup=C.record_pid)}
    pids: dict[str, object] = {}
    t = interleaved_in_workers(specs, repeats=4, warmup=1, setup_results=pids)
    assert list(t) == ["A", "B"] and [len(x.seconds) for x in t.values()] == [4, 4]
    # warmup A B, then the rounds A B, B A, A B, B A
    assert open(log).read().split() == ["A", "B", "A", "B", "B", "A", "A", "B", "B", "A"]
    assert all(0.05 <= s < 0.5 for s in t["A"].seconds), t["A"].seconds
    assert all(s < 0.04 for s in t["B"].seconds), t["B"].seconds  # its own step only: not A's sleep, no startup
    assert len({pids["A"], pids["B"], os.getpid()}) == 3
    assert "BENCH_WORKER_TEST" not in os.environ  # the env was the worker's, not this process's


def test_the_worker_measures_a_step_and_not_the_pipe():
    with Workers({"sleep": Spec(C.sleeper, (0.05,)), "matmul": Spec(C.matmul, (64,))}) as w:
        start = time.perf_counter()
        seconds = w.run("sleep")
        outside = time.perf_counter() - start
        assert 0.05 <= seconds < 0.5 and seconds <= outside
        assert w.run("matmul") < 0.05


@pytest.mark.parametrize("spec, message", [
    (Spec(C.failing_factory), "contender 'bad' failed in its worker process: ValueError: no model here"),
    (Spec(C.failing_run), "contender 'bad' failed in its worker process: RuntimeError: step exploded"),
    (Spec(C.dying_run), "contender 'bad': its worker process died (exit code 3)"),
], ids=["factory", "run", "died"])
def test_a_failure_in_a_worker_is_one_line_naming_the_contender(spec, message):
    start = time.perf_counter()
    with pytest.raises(WorkerError) as e:
        interleaved_in_workers({"good": Spec(C.sleeper, (0.0,)), "bad": spec}, repeats=2)
    assert str(e.value) == message
    assert time.perf_counter() - start < 20  # no hang; the good worker was stopped (fixture)
    if "died" not in message:
        assert "Traceback" in e.value.details


def test_ctrl_c_while_a_worker_runs_stops_it_at_once():
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.5)  # during the 60 s step, after the workers started
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            interleaved_in_workers({"quick": Spec(C.sleeper, (0.0,)), "slow": Spec(C.sleeper, (60.0,))}, repeats=1)
        assert time.perf_counter() - start < 8  # the busy worker is terminated, not waited for (STOP_SECONDS)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
