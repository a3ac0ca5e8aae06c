"""train.host_memory.keep_freed_memory: a freed large block is reused without page faults; a no-op once JAX runs."""

import subprocess
import sys

import pytest

FAULTS_OF_SECOND_BLOCK = """
import ctypes, resource, sys
from memllm_jax.train.host_memory import keep_freed_memory
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


def _second_block(mode: str) -> tuple[bool, int]:
    out = subprocess.run([sys.executable, "-c", FAULTS_OF_SECOND_BLOCK, mode], capture_output=True, text=True,
                         check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_kept_memory_is_reused_without_page_faults():
    applied, kept_faults = _second_block("keep")
    _, default_faults = _second_block("default")
    assert applied
    pages = 256 * 2**20 // 4096
    assert default_faults > pages // 2  # glibc maps a block this large afresh: every page faults again
    assert kept_faults < pages // 20


def test_no_op_once_jax_runs():
    import jax.numpy as jnp

    from memllm_jax.train.host_memory import keep_freed_memory

    jnp.ones(2).block_until_ready()
    assert keep_freed_memory() is False
