"""runtime.host_memory: a freed large block is reused without page faults (keep_freed_memory), a no-op once JAX runs;
release_freed_memory gives the kept pages back."""

import os
import subprocess
import sys

import jax.numpy as jnp
import pytest

from memllm_jax.runtime import host_memory

FAULTS_OF_SECOND_BLOCK = """
import ctypes, resource, sys
from memllm_jax.runtime.host_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else False
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
size = 256 * 2**20
def touch_block():  # as XLA's per-execution temporary buffer: malloc, write every page, free
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
touch_block()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
touch_block()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _second_block(mode: str, env: dict | None = None) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", FAULTS_OF_SECOND_BLOCK, mode], capture_output=True, text=True,
                         check=True, env=env).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_kept_memory_is_reused_without_page_faults():
    applied, kept_faults = _second_block("keep")
    _, default_faults = _second_block("default")
    assert applied
    pages = 256 * 2**20 // 4096
    assert default_faults > pages // 2  # glibc maps a block this large afresh: every page faults again
    assert kept_faults < pages // 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_environment_opt_out_leaves_malloc_as_it_is():
    applied, faults = _second_block("keep", env={**os.environ, "MEMLLM_DEFAULT_MALLOC": "1"})
    assert not applied and faults > 256 * 2**20 // 4096 // 2


def test_no_op_once_jax_runs():
    jnp.ones(2).block_until_ready()
    assert host_memory.keep_freed_memory() is False


RESIDENT_AFTER_RELEASE = """
import ctypes
from memllm_jax.runtime.host_memory import keep_freed_memory, release_freed_memory
def resident_mb():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 // 2**20
assert keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
keep = libc.malloc(1 << 20)
big = libc.malloc(256 << 20)
last = libc.malloc(1 << 20)  # a live block above the freed one: trimming the heap's top alone cannot free it
ctypes.memset(big, 1, 256 << 20)
libc.free(big)
held = resident_mb()
print(held, release_freed_memory(), resident_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc")
def test_release_gives_kept_pages_back():
    out = subprocess.run([sys.executable, "-c", RESIDENT_AFTER_RELEASE], capture_output=True, text=True,
                         check=True).stdout.split()
    held, released, after = int(out[0]), out[1] == "True", int(out[2])
    assert released and held - after > 200, (held, after)


def _meminfo(tmp_path, total_kb: int, available_kb: int) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       {total_kb} kB\nMemFree:         1000 kB\nMemAvailable:   {available_kb} kB\n")
    return str(path)


def test_release_if_memory_low_reads_the_hosts_available_fraction(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(host_memory, "release_freed_memory", lambda: calls.append(1) or True)
    assert host_memory.release_if_memory_low(0.25, _meminfo(tmp_path, 1000, 300)) is False and not calls
    assert host_memory.release_if_memory_low(0.25, _meminfo(tmp_path, 1000, 200)) is True and calls == [1]
    assert host_memory.release_if_memory_low(0.25, str(tmp_path / "absent")) is False


def test_memory_is_given_back_when_the_host_could_not_hold_the_largest_step_rise(tmp_path, monkeypatch):
    """A step can take a whole step's buffers of fresh memory (`StepRise`): the kept pages are given back when the
    host has less than 1.25 x the largest rise over one step available, measured again after a release."""
    calls = []
    monkeypatch.setattr(host_memory, "release_freed_memory", lambda: calls.append(1) or True)
    status = tmp_path / "status"

    def rss(gb: float):
        status.write_text(f"Name:\tpython\nVmHWM:\t 1 kB\nVmRSS:\t {int(gb * 1e6)} kB\n")

    rss(2.0)
    rise = host_memory.StepRise(str(status))
    rss(6.0)  # the first step: its buffers
    assert rise.need_bytes() == 5_000_000_000 and rise.largest == 4_000_000_000
    rss(6.0)
    assert rise.need_bytes() == 5_000_000_000  # no rise: the largest stays
    rss(9.0)  # a jump smaller than the first rise
    assert rise.need_bytes() == 5_000_000_000
    plenty = _meminfo(tmp_path, 24_000_000, 12_000_000)  # kB
    assert host_memory.release_if_memory_low(0.1, plenty, need_bytes=rise.need_bytes()) is False and not calls
    short = _meminfo(tmp_path, 24_000_000, 4_000_000)
    assert host_memory.release_if_memory_low(0.1, short, need_bytes=rise.need_bytes()) is True and calls == [1]
    rss(5.0)
    rise.released()
    rss(11.0)  # a jump of 6 GB from the released level raises the need
    assert rise.need_bytes() == 7_500_000_000
    assert host_memory.StepRise(str(tmp_path / "absent")).need_bytes() == 0


def test_process_memory_is_read_from_proc_status(tmp_path):
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t 2500000 kB\nVmRSS:\t 1250000 kB\n")
    assert host_memory.process_memory_gb(str(status)) == {"host_rss_gb": 1.25, "host_peak_gb": 2.5}
    assert host_memory.process_memory_gb(str(tmp_path / "absent")) == {}
    own = host_memory.process_memory_gb()
    assert 0 < own["host_rss_gb"] <= own["host_peak_gb"]
