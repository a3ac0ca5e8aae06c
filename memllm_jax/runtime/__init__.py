"""What this host needs at run time beyond the model's own work: everything here is for a CPU host.

On a CPU backend XLA's step buffers live in host memory and every compiled kernel is mapped into the process,
so a long CPU run needs three things an accelerator run does not: glibc malloc settings that keep freed memory
for reuse, and giving it back when the host runs short (`host_memory`); dropping compiled executables before the
process reaches the kernel's cap on memory mappings (`compiled_code`); and training two independent adapters
side by side in a second process, since one training leaves part of a 2-core CPU idle (`side_process`).

The training loop and the pipeline do not know of any of it: they ask this module once.

- `keep_freed_memory_default()`: whether a process should apply `keep_freed_memory()` (first thing, before
  JAX starts).
- `for_this_host()`: the training-loop hooks this host needs (`train.loop.run` attaches them).
- `after_stage(say)`: what a process running several jobs in turn (the pipeline's stages) calls after each.
- `parallel_adapters_available()`: whether two trainings side by side pay here.

Each decision reads the JAX backend once it has started, and before that judges from what is installed and
`JAX_PLATFORMS` without starting it (the malloc settings must come before).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import sys
from typing import Callable

from memllm_jax.runtime.compiled_code import release_if_many_mappings
from memllm_jax.runtime.host_memory import keep_freed_memory, release_freed_memory
from memllm_jax.runtime.side_process import SideProcess
from memllm_jax.runtime.train_hook import HostMemoryHook

__all__ = ["after_stage", "cpu_cores", "for_this_host", "keep_freed_memory", "keep_freed_memory_default",
           "on_cpu", "parallel_adapters_available", "SideProcess"]


def _backend_started() -> bool:
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge  # jax is imported already: no cost

    return bool(xla_bridge.backends_are_initialized())


def _accelerator_installed() -> bool:
    """Whether JAX would pick an accelerator here, judged without starting it: `JAX_PLATFORMS` when set, else
    an installed TPU runtime (`libtpu`) or PJRT plugin (the `jax_plugins` package or entry points, e.g. CUDA's)."""
    platforms = os.environ.get("JAX_PLATFORMS", "") or os.environ.get("JAX_PLATFORM_NAME", "")
    if platforms.strip():
        return any(p.strip() not in ("", "cpu") for p in platforms.split(","))
    return (importlib.util.find_spec("libtpu") is not None or importlib.util.find_spec("jax_plugins") is not None
            or bool(importlib.metadata.entry_points(group="jax_plugins"))
            or bool(os.environ.get("PJRT_NAMES_AND_LIBRARY_PATHS")))


def on_cpu() -> bool:
    """Whether JAX computes on this host's CPU: `jax.default_backend()` once JAX's backend has started, else
    whether no accelerator is installed (asking JAX would start it)."""
    if _backend_started():
        import jax  # imported already (see `_backend_started`)

        return jax.default_backend() == "cpu"
    return not _accelerator_installed()


def cpu_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def keep_freed_memory_default() -> bool:
    """Keep freed host memory for reuse (`host_memory.keep_freed_memory`) on a CPU host: its step buffers are
    host memory. Call before JAX starts."""
    return on_cpu()


def parallel_adapters_available() -> bool:
    """Two trainings side by side pay on a CPU host with at least 2 cores and no accelerator; on an accelerator
    they would compete for the device."""
    return on_cpu() and cpu_cores() >= 2


def for_this_host() -> list:
    """The training-loop hooks this host needs (fresh objects for one run): the host-memory hook on a CPU
    backend, none on a TPU or GPU."""
    return [HostMemoryHook()] if on_cpu() else []


def after_stage(say: Callable[[str], None] | None = None) -> None:
    """Between two jobs of one process on a CPU host: give the kept freed memory back (each job keeps it for
    its own steps, not for the next) and drop compiled code when the process holds many memory mappings."""
    if not on_cpu():
        return
    release_freed_memory()
    release_if_many_mappings(say)
