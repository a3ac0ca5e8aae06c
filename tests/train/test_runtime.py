"""memllm_jax.runtime: the CPU host's hooks and choices, none of them on an accelerator backend; decided before
JAX starts without starting it; the host-memory hook's calls and log lines."""

import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from memllm_jax import runtime
from memllm_jax.runtime import train_hook
from memllm_jax.runtime.train_hook import HostMemoryHook


@pytest.fixture
def released(monkeypatch):
    """The between-stage releases, recorded instead of run."""
    calls = []
    monkeypatch.setattr(runtime, "release_freed_memory", lambda: calls.append("trim") or True)
    monkeypatch.setattr(runtime, "release_if_many_mappings", lambda say: calls.append(("mappings", say)) or False)
    return calls


def test_cpu_backend_gets_the_cpu_hooks_and_choices(released, monkeypatch):
    jax.devices()  # the backend has started: the runtime asks it
    assert jax.default_backend() == "cpu"
    hooks = runtime.for_this_host()
    assert [type(h) for h in hooks] == [HostMemoryHook]
    assert runtime.for_this_host()[0] is not hooks[0]  # fresh per run (each measures its own steps)
    assert runtime.keep_freed_memory_default()
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 2)
    assert runtime.parallel_adapters_available()
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 1)
    assert not runtime.parallel_adapters_available()  # one core: nothing to gain from a second process
    runtime.after_stage(print)
    assert released == ["trim", ("mappings", print)]


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_accelerator_backend_gets_no_cpu_hooks(backend, released, monkeypatch):
    jax.devices()
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    monkeypatch.setattr(runtime, "cpu_cores", lambda: 16)
    assert runtime.for_this_host() == []
    assert not runtime.keep_freed_memory_default()
    assert not runtime.parallel_adapters_available()
    runtime.after_stage(print)
    assert released == []


BEFORE_JAX = """
import sys
from memllm_jax import runtime
print(runtime.on_cpu(), runtime.keep_freed_memory_default(), "jax" in sys.modules)
"""


@pytest.mark.parametrize("platforms, cpu", [("cpu", True), ("tpu", False), ("cuda,cpu", False)])
def test_before_jax_starts_the_choice_comes_from_jax_platforms_without_importing_jax(platforms, cpu):
    env = {**os.environ, "JAX_PLATFORMS": platforms}
    out = subprocess.run([sys.executable, "-c", BEFORE_JAX], capture_output=True, text=True, check=True,
                         env=env).stdout.split()
    assert out == [str(cpu), str(cpu), "False"]


def test_host_memory_hook_stops_keeping_at_a_change_of_shape_and_says_when_it_gives_memory_back(monkeypatch):
    stops, lines = [], []
    monkeypatch.setattr(train_hook, "stop_keeping_freed_memory", lambda: stops.append(1) or len(stops) == 1)
    monkeypatch.setattr(train_hook, "release_if_memory_low", lambda need_bytes: True)
    hook = HostMemoryHook()
    hook.on_start(0, lines.append)
    small, large = {"inputs": np.zeros((1, 8, 32))}, {"inputs": np.zeros((1, 8, 64))}
    for step, batch in enumerate([small, small, large, small, small], start=1):
        hook.before_step(step, batch)
    assert len(stops) == 2  # at steps 3 and 4 (the second finds nothing kept any more: no line)
    assert lines == ["step 3: the batch shape changes (length buckets): freed memory no longer kept for reuse "
                     "(glibc's malloc defaults from here on)"]
    lines.clear()
    for step in range(1, 101):
        hook.on_step(step, {"loss": 1.0})
    assert [line.split(":")[0] for line in lines] == ["step 1", "step 10", "step 100"]  # the 1st, 10th, 100th release
    assert "given back (malloc_trim; 10 times so far" in lines[1]
    hook.on_end(100)
