"""Run each benchmark contender in its own process, so that what one leaves behind (a kept malloc heap,
torch's allocator and OpenMP threads) cannot slow another one down.

A worker starts from a `Spec`: its environment variables and an optional setup function are applied first in
the fresh (spawned) process, before the factory's arguments are unpickled or anything imports JAX or torch;
then the factory builds the contender, a callable that runs once and blocks until done. The worker serves the
parent's requests one at a time and times each call itself (`time.perf_counter`), so the pipe's latency is not
counted. `Workers` builds the contenders one after the other and stops them on exit, also on an error or
Ctrl-C; `interleaved_in_workers` is `timing.interleaved` with every contender in its own worker.
"""

from __future__ import annotations

import dataclasses
import functools
import multiprocessing
import os
import pickle
import time
import traceback
from typing import Callable

from memllm_jax.bench.timing import Timing, interleaved

STOP_SECONDS = 10.0
"""How long an idle worker gets to exit after "stop" before it is terminated."""


@dataclasses.dataclass(frozen=True)
class Spec:
    factory: Callable[..., Callable[[], object]]
    """A module-level function (pickled by name) returning the contender; called with `args` and `kwargs`."""
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    """Set in the worker's environment first (e.g. for libraries that read it when loaded)."""
    setup: Callable[[], object] | None = None
    """A module-level function called in the worker before the factory, e.g. `host_memory.keep_freed_memory`."""

    def build(self) -> Callable[[], object]:
        return self.factory(*self.args, **self.kwargs)


class WorkerError(RuntimeError):
    """A contender failed in its worker, or its worker died. The message is one line naming the contender;
    `details` holds the worker's traceback."""

    def __init__(self, message: str, details: str = ""):
        super().__init__(message)
        self.details = details


def _serve(conn, env: dict[str, str], setup: bytes, spec: bytes) -> None:
    """The worker: set up, build, reply ("ready", setup's result), then answer every "run" with ("ok", seconds)
    until "stop" or the parent goes away. An error is sent back as ("error", one line, traceback)."""
    try:
        os.environ.update(env)
        setup_fn = pickle.loads(setup)
        result = setup_fn() if setup_fn is not None else None
        fn = pickle.loads(spec).build()
        conn.send(("ready", result))
        while conn.recv() == "run":
            start = time.perf_counter()
            fn()
            conn.send(("ok", time.perf_counter() - start))
    except (EOFError, KeyboardInterrupt):  # the parent is gone, or Ctrl-C reached the whole process group
        pass
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
        lines = str(e).strip().splitlines()
        try:
            conn.send(("error", type(e).__name__ + (f": {lines[0]}" if lines else ""), traceback.format_exc()))
        except (OSError, ValueError):
            pass
    finally:
        conn.close()


class Workers:
    """One spawned worker process per contender, as a context manager; only one runs at a time."""

    def __init__(self, specs: dict[str, Spec]):
        self.specs = specs
        self.setup_results: dict[str, object] = {}
        """What each worker's `Spec.setup` returned (None without one)."""
        self._procs: dict[str, multiprocessing.process.BaseProcess] = {}
        self._conns: dict[str, object] = {}
        self._busy: set[str] = set()

    def __enter__(self) -> Workers:
        ctx = multiprocessing.get_context("spawn")
        try:
            for name, spec in self.specs.items():  # one at a time: a build does not share the CPU
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_serve, name=f"bench worker {name}", daemon=True,
                                   args=(child, spec.env, pickle.dumps(spec.setup), pickle.dumps(spec)))
                proc.start()
                child.close()  # so that the worker's death reads as EOF here
                self._procs[name], self._conns[name] = proc, parent
                self._busy.add(name)
                self.setup_results[name] = self._reply(name)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, name: str) -> float:
        """Run contender `name` once in its worker; the seconds the worker measured."""
        self._busy.add(name)
        self._conns[name].send("run")
        return self._reply(name)

    def callables(self) -> dict[str, Callable[[], float]]:
        return {name: functools.partial(self.run, name) for name in self.specs}

    def _reply(self, name: str) -> object:
        try:
            msg = self._conns[name].recv()
        except (EOFError, OSError):
            proc = self._procs[name]
            proc.join(1.0)
            raise WorkerError(f"contender {name!r}: its worker process died (exit code {proc.exitcode})") from None
        self._busy.discard(name)
        if msg[0] == "error":
            raise WorkerError(f"contender {name!r} failed in its worker process: {msg[1]}", msg[2])
        return msg[1]

    def close(self) -> None:
        """Stop every worker: idle ones are asked to exit, a busy one (an error or Ctrl-C while it ran) is
        terminated; any still alive after `STOP_SECONDS` is terminated, then killed."""
        for name, conn in self._conns.items():
            if name in self._busy:
                self._procs[name].terminate()
            else:
                try:
                    conn.send("stop")
                except (OSError, ValueError):
                    pass
            conn.close()
        deadline = time.monotonic() + STOP_SECONDS
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(5.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._procs, self._conns, self._busy = {}, {}, set()


def interleaved_in_workers(specs: dict[str, Spec], repeats: int = 7, warmup: int = 1,
                           setup_results: dict[str, object] | None = None) -> dict[str, Timing]:
    """`timing.interleaved` (same rotation and warmup) with each contender in its own worker process, timed
    there. `setup_results`, when given, receives what each worker's setup returned."""
    with Workers(specs) as workers:
        if setup_results is not None:
            setup_results.update(workers.setup_results)
        return interleaved(workers.callables(), repeats=repeats, warmup=warmup, self_timed=True)
