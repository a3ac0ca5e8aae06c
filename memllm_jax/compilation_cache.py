"""JAX's persistent compilation cache, one directory per kind of host.

A compiled program is written to the cache and read back by a later process that compiles the same program: a
rerun stage, a sweep point of another config, the memory-read adapter's training after the memory-write adapter's
(same shapes). JAX's cache key covers the program, the jax / XLA versions and flags and the device kind, but on
a CPU the device kind is just "cpu", while XLA compiles for the CPU's own instruction set (AMX, AVX-512): an
executable from one CPU may not run on another that shares the directory (a cluster's home directory). So
`enable(path)` uses a subdirectory named for this host's CPU (`host_dir`).

The cache is process-wide and JAX decides whether to use it at the process's first compilation: enable it
before anything is compiled.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import platform

import jax


def host_dir(cpuinfo: str | None = None) -> str:
    """`host-<12 hex digits>` naming this host's CPU: the machine type, and the model name and feature flags of
    /proc/cpuinfo's first processor (the machine type alone where it cannot be read)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = " ".join(sorted(fields.get("flags", "").split()))
    ident = "\n".join([platform.machine(), fields.get("model name", ""), flags])
    return "host-" + hashlib.sha256(ident.encode()).hexdigest()[:12]


def enable(path: str | os.PathLike) -> str:
    """Point JAX's persistent cache at `path/host_dir()` and keep every compiled program there (however quick
    to compile: the decoding stages compile hundreds of small programs). Returns that directory."""
    directory = pathlib.Path(path) / host_dir()
    directory.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return str(directory)
