"""Reuse freed host memory across training steps instead of page-faulting it in again every step.

On Linux with glibc, XLA's CPU runtime allocates each execution's temporary buffer afresh (2.5 GB for the
SmolLM2-135M LoRA step at batch 4 x 256); glibc serves an allocation that large with its own `mmap` and unmaps
it when freed, so every step faults the whole buffer in again: ~660k minor page faults, each a page the kernel
zeroes. Measured on the 2-core host: 1.4-1.8 s of system CPU time in a ~5 s step, the step ~1.27x slower than
with the memory kept (4.84 s against 3.79 s, median of 15 steps each), and most of its step-to-step spread.

`keep_freed_memory` sets glibc's malloc to serve every allocation from its main heap (one arena, no `mmap`) and
to never give freed heap memory back to the system, so from the second step on the buffer's pages are reused.
The process then holds its peak memory until it exits, as a training process does anyway. A process that runs
several jobs in turn (`memllm run`'s stages) calls `release_freed_memory` between them: without it the
embedded default's pipeline held 18.5 GB of a 24 GB host after its two training stages, of which `malloc_trim`
released 16.4 GB (2.1 GB live).

The kept heap also holds on to fragments: a job whose steps change shape (length buckets, evaluation batches) can
grow it well past one step's need: the SmolLM2 memory-read adapter at 8 x 512 tokens with buckets (256, 512) was
killed by the kernel at 24 GB after 13 steps on a 24 GB host. The training loop's host-memory hook
(`runtime.train_hook.HostMemoryHook`) therefore calls `release_if_memory_low` after every step: when the host's
available memory falls below a quarter of its total, the kept free pages are given back (the next step faults its
buffers in once, as without the setting). That check comes too late for a step that grows the heap by more than the
margin: with buckets (256, 512) at 8 x 512, the memory-write adapter went from 16 GB to 24.4 GB within one step
after alternating shapes (its free blocks the wrong sizes for the next step's buffers) and was killed. Giving the
pages back at every change of shape kept it alive but at 25 s per step (half its steps changed shape), slower than
glibc's defaults (17-20 s). So the kept heap is for runs of one batch shape: at the first change of shape the hook
calls `stop_keeping_freed_memory`, which restores glibc's defaults for the rest of the process and gives the kept
pages back.
Runs of one shape jump too, rarely: a step's buffers can miss the hole the last step's left and come from fresh
memory (`StepRise`; 14.0 -> 24.4 GB within one step, killed). So the pages are also given back whenever the
host's available memory is below 1.25 x the largest rise of the process's resident memory over one step seen so
far (at first the first step's): a jump then always fits. Where a step's buffers take more than the host's spare
memory, that is every step, i.e. glibc's defaults' speed; two micro-batches halve the buffers.
`MEMLLM_DEFAULT_MALLOC=1` in the environment leaves malloc as it is (slower steps, a peak of one step's buffers).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8
GLIBC_DEFAULTS = ((M_MMAP_MAX, 65536), (M_MMAP_THRESHOLD, 128 * 1024), (M_TRIM_THRESHOLD, 128 * 1024))
"""glibc's documented defaults of the settings `keep_freed_memory` changes (the arena count stays at one)."""

_keeping = False


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def _jax_backend_started() -> bool:
    """Whether JAX has created its clients: their threads have then picked their malloc arenas already, and an
    allocation made from another arena than the main one still goes to `mmap`."""
    if "jax" not in sys.modules:
        return False
    try:
        from jax._src import xla_bridge
    except ImportError:
        return False
    return bool(xla_bridge.backends_are_initialized())


def _mallopt():
    """glibc's `mallopt(option, value)` with its C signature."""
    mallopt = _libc().mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def keep_freed_memory() -> bool:
    """Apply the glibc malloc settings of the module docstring; True when applied. Does nothing (False) off
    Linux, without glibc's `mallopt`, with `MEMLLM_DEFAULT_MALLOC=1` in the environment, or once JAX's backend
    has started (call it first thing in a process)."""
    if os.environ.get("MEMLLM_DEFAULT_MALLOC", "") not in ("", "0"):
        return False
    if not sys.platform.startswith("linux") or _jax_backend_started():
        return False
    try:
        mallopt = _mallopt()
    except (OSError, AttributeError):
        return False
    # One arena: threads' arenas other than the main one would still `mmap` large blocks. -1 is SIZE_MAX as
    # glibc reads the trim threshold: never trim.
    global _keeping
    settings = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
    _keeping = all(mallopt(option, value) == 1 for option, value in settings)
    return _keeping


def stop_keeping_freed_memory() -> bool:
    """Undo `keep_freed_memory` for the rest of the process (glibc's defaults again, so large buffers are mapped
    and unmapped per allocation) and give the kept pages back; True when it was keeping them."""
    global _keeping
    if not _keeping:
        return False
    mallopt = _mallopt()
    for option, value in GLIBC_DEFAULTS:
        mallopt(option, value)
    _keeping = False
    release_freed_memory()
    return True


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the system (glibc `malloc_trim(0)`), e.g. between two jobs of one
    process after `keep_freed_memory`; True when glibc released any. Does nothing (False) off Linux or glibc."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = _libc().malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes, malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    return malloc_trim(0) == 1


def _meminfo_kb(meminfo: str) -> dict[str, int] | None:
    try:
        with open(meminfo) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return {k: int(fields[k].split()[0]) for k in ("MemTotal", "MemAvailable")}
    except (OSError, KeyError, ValueError):
        return None


def release_if_memory_low(min_available: float = 0.25, meminfo: str = "/proc/meminfo", need_bytes: int = 0) -> bool:
    """`release_freed_memory` when the host's available memory is below `min_available` of its total or below
    `need_bytes` (the kept heap's free pages count as used); True when it released any. Cheap enough to call after
    every step."""
    kb = _meminfo_kb(meminfo)
    if not kb or not kb["MemTotal"]:
        return False
    low = kb["MemAvailable"] < min_available * kb["MemTotal"] or kb["MemAvailable"] * 1024 < need_bytes
    return low and release_freed_memory()


class StepRise:
    """The largest rise of this process's resident memory over one training step, for `release_if_memory_low`'s
    `need_bytes`: in the kept heap a step can take a whole step's buffers of fresh memory (see `need_bytes`), so
    the host must have that much available before every step.

    XLA allocates a step's buffers afresh every step. In the kept heap (one arena, never trimmed) a small block
    another thread allocates meanwhile can, as far as the measurements show (the cause is inferred), land in the hole the last step's buffers left; the next step's buffers
    no longer fit there and come from the top of the heap, so the resident memory jumps by a whole step's buffers
    within one step. Measured on a 24 GB host (SmolLM2-135M memory-write LoRA step, 8 x 512 tokens):
    14.0 -> 24.4 GB during step 59, killed by the kernel (an earlier run: 14.5 -> 24.3 GB during step 184); with two
    micro-batches 7.6 -> 13.2 GB at step 62. The first step's rise (its buffers, and the compilation's) sets the
    measure, and a later jump can only raise it."""

    def __init__(self, status: str = "/proc/self/status", margin: float = 1.25):
        self.status, self.margin = status, margin
        self.largest = 0
        self.last = self._rss()

    def _rss(self) -> int | None:
        gb = process_memory_gb(self.status).get("host_rss_gb")
        return None if gb is None else int(gb * 1e9)

    def need_bytes(self) -> int:
        """After a step: `margin` x the largest rise so far, in bytes (0 where /proc is missing)."""
        now = self._rss()
        if now is not None and self.last is not None:
            self.largest = max(self.largest, now - self.last)
        self.last = now
        return int(self.margin * self.largest)

    def released(self) -> None:
        """The free pages were just given back: measure the next rise from here."""
        self.last = self._rss()


def process_memory_gb(status: str = "/proc/self/status") -> dict[str, float]:
    """This process's resident memory now and at its peak (`VmRSS`, `VmHWM`) in GB, as `{"host_rss_gb",
    "host_peak_gb"}`; empty where /proc is missing. Logged with every training metrics line, so a run that grows
    towards the host's memory shows it before the kernel kills it."""
    keys = {"VmRSS": "host_rss_gb", "VmHWM": "host_peak_gb"}
    try:
        with open(status) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return {name: round(int(fields[k].split()[0]) / 1e6, 3) for k, name in keys.items()}  # kB -> GB
    except (OSError, KeyError, ValueError):
        return {}
