"""The machine's dense matmul ceiling: the best FLOP/s over several sizes, repetitions, frameworks and dtypes.

An "of ceiling" column is only honest if no contender can beat the ceiling. One square size in one framework
is not a ceiling: XLA and torch (oneDNN / MKL) pick different kernels and thread counts, and small matmuls
underuse the cores, so the model bench once printed 131% of a 1024^3 jax float32 "ceiling". Here every
(framework, dtype, size) is timed best-of-`repeats`, and the ceiling is the maximum.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Sequence

SIZES = (512, 1024, 2048)
FRAMEWORKS = ("jax", "torch")


@dataclasses.dataclass(frozen=True)
class Measurement:
    framework: str
    dtype: str
    n: int
    seconds: float
    """Best (minimum) time of one n x n x n matmul."""

    @property
    def flops(self) -> float:
        return 2.0 * self.n**3 / self.seconds


@dataclasses.dataclass(frozen=True)
class Ceiling:
    measurements: tuple[Measurement, ...]

    @property
    def best(self) -> Measurement:
        return max(self.measurements, key=lambda m: m.flops)

    @property
    def flops(self) -> float:
        return self.best.flops

    def describe(self) -> str:
        b = self.best
        return (f"matmul ceiling {b.flops / 1e9:.1f} GFLOP/s ({b.framework} {b.dtype} {b.n}^3; best of "
                f"{len(self.measurements)} framework/dtype/size points)")


def matmul_fn(framework: str, dtype: str, n: int) -> Callable[[], object] | None:
    """A blocking n x n x n matmul in `framework`, or None when that framework is not installed."""
    import numpy as np

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n), np.float32) for _ in range(2))
    if framework == "jax":
        import jax
        import jax.numpy as jnp

        x, y = jnp.asarray(a, dtype), jnp.asarray(b, dtype)
        # Low-precision operands with float32 results, as the model multiplies them (`model/matmul.py`).
        f = jax.jit(lambda u, v: jnp.matmul(u, v, preferred_element_type=jnp.float32))
        return lambda: f(x, y).block_until_ready()
    if framework == "torch":
        try:
            import torch
        except ImportError:
            return None
        x, y = (torch.from_numpy(m).to(getattr(torch, dtype)) for m in (a, b))
        return lambda: torch.mm(x, y)
    raise ValueError(f"unknown framework {framework!r}")


def model_dtypes(cfg) -> list[str]:
    """The dtypes a model's matmuls can run in (a `ModelConfig`'s parameters, activations, matmul operands)."""
    return sorted({cfg.param_dtype, cfg.compute_dtype, cfg.operand_dtype})


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # compile / warm up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(dtypes: Sequence[str] = ("float32",), sizes: Sequence[int] = SIZES, frameworks: Sequence[str] = FRAMEWORKS,
            repeats: int = 5) -> Ceiling:
    """Time every (framework, dtype, size); the ceiling is the fastest of them in FLOP/s."""
    out = []
    for framework in frameworks:
        for dtype in dtypes:
            for n in sizes:
                fn = matmul_fn(framework, dtype, n)
                if fn is not None:
                    out.append(Measurement(framework, dtype, n, best_seconds(fn, repeats)))
    if not out:
        raise RuntimeError(f"no matmul could be timed in {list(frameworks)}")
    return Ceiling(tuple(out))
