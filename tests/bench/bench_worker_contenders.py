"""Tiny contenders for tests/bench/test_bench_workers.py: module-level factories a spawned worker imports by name."""

from __future__ import annotations

import os
import time

import numpy as np

SETUP_PID: int | None = None


def record_pid() -> int:
    """A worker setup: remembers and returns its process id (the factory checks that it ran first)."""
    global SETUP_PID
    SETUP_PID = os.getpid()
    return SETUP_PID


def logged_sleep(log: str, label: str, seconds: float, env_var: str = ""):
    """Appends `label` to the file `log` and sleeps `seconds` per run; with `env_var`, requires the setup to have
    run in this process and that variable to be set."""
    if env_var and (SETUP_PID != os.getpid() or os.environ.get(env_var) != "yes"):
        raise AssertionError(f"setup or {env_var} missing in the worker")

    def run():
        with open(log, "a") as f:
            f.write(label + "\n")
        time.sleep(seconds)

    return run


def matmul(n: int):
    a = np.ones((n, n))
    return lambda: a @ a


def failing_factory():
    raise ValueError("no model here")


def failing_run():
    def run():
        raise RuntimeError("step exploded\nsecond line of the message")

    return run


def dying_run():
    return lambda: os._exit(3)


def sleeper(seconds: float):
    return lambda: time.sleep(seconds)
