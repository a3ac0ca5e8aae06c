"""Compiled executables are given back before the process nears the kernel's cap on memory mappings."""

import jax
import jax.numpy as jnp
import pytest

from memllm_jax.runtime import compiled_code


def _f(x):
    for i in range(20):
        x = jnp.tanh(x @ x.T + i) * 2 + jnp.sin(x).sum(0)
    return x


F = jax.jit(_f)  # alive for the test's whole run, as a model's jitted step is (a collected function frees its code)


def _compile_some(n: int = 6) -> None:
    for size in range(5, 5 + n):  # one executable per shape
        F(jnp.ones((size, size))).block_until_ready()


@pytest.mark.slow
@pytest.mark.skipif(compiled_code.mapping_limit() is None, reason="no /proc/sys/vm/max_map_count here")
def test_release_drops_compiled_code_only_near_the_cap(monkeypatch):
    _compile_some()
    said = []
    # far from the cap (set here: a test worker that ran many compiling tests before may hold half the real one)
    monkeypatch.setattr(compiled_code, "mapping_limit", lambda: 4 * compiled_code.mapping_count())
    assert not compiled_code.release_if_many_mappings(said.append)
    assert said == []
    before = compiled_code.mapping_count()
    monkeypatch.setattr(compiled_code, "mapping_limit", lambda: before)  # as if the process held all of it
    assert compiled_code.release_if_many_mappings(said.append)
    after = compiled_code.mapping_count()
    assert after < before - 100, (before, after)  # the executables' code and data were unmapped
    assert len(said) == 1 and f"{before:,} of the process's {before:,}" in said[0]
    _compile_some(1)  # jitted functions compile again afterwards


def test_no_release_where_the_cap_is_unknown(monkeypatch):
    monkeypatch.setattr(compiled_code, "mapping_limit", lambda: None)
    assert not compiled_code.release_if_many_mappings(fraction=0.0)
