"""JAX's persistent compilation cache: one directory per kind of host, read back by a later process."""

import os
import subprocess
import sys
import textwrap

from memllm_jax.compilation_cache import host_dir

CPUINFO = "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu sse2 avx512f {extra}\n\nprocessor\t: 1\nflags\t: x\n"


def test_host_dir_names_the_cpu_model_and_features():
    amx = host_dir(CPUINFO.format(extra="amx_bf16 amx_tile"))
    assert amx.startswith("host-") and len(amx) == len("host-") + 12
    assert amx == host_dir(CPUINFO.format(extra="amx_tile amx_bf16"))  # the flags' order does not matter
    assert amx != host_dir(CPUINFO.format(extra=""))  # another instruction set: another directory
    assert amx != host_dir(CPUINFO.format(extra="amx_bf16 amx_tile").replace("Some Xeon", "Another CPU"))
    assert host_dir("") == host_dir("") and host_dir("") != amx


PROGRAM = textwrap.dedent("""
    import sys, jax, jax.numpy as jnp, jax.monitoring
    from memllm_jax import compilation_cache
    hits = []
    jax.monitoring.register_event_listener(lambda e, **_: hits.append(e) if e.endswith("cache_hits") else None)
    print(compilation_cache.enable(sys.argv[1]))
    print(float(jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((16, 16)))), len(hits))
""")


def test_a_second_process_reads_the_programs_back(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    runs = [subprocess.run([sys.executable, "-c", PROGRAM, str(tmp_path / "cache")], capture_output=True, text=True,
                           env=env, check=True).stdout.split() for _ in range(2)]
    (directory, value, hits), (directory2, value2, hits2) = runs
    assert directory == directory2 == str(tmp_path / "cache" / host_dir())
    assert os.listdir(directory) and value == value2
    assert int(hits) == 0 and int(hits2) >= 1  # compiled once, then read back
