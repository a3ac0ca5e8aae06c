"""Matmuls of low-precision operands accumulated in float32 (`ModelConfig.matmul_dtype`).

`mixed_matmul(x_TxI, w, "bfloat16")` rounds both operands to bfloat16, multiplies them exactly and
accumulates in float32: what TPUs do for float32 matmuls at JAX's default precision, and what XLA's CPU
library kernels (YNNPACK / oneDNN) run on AMX or AVX512-BF16 several times faster than float32 matmuls
(2-core Xeon with AMX, 4096 x 576 x 1536: ~1,650 GFLOP/s against ~320). Three details keep it on the fast path:

- the result is asked for in float32 (`preferred_element_type`): a bfloat16-out dot is not offloaded and
  runs at float32 speed or slower;
- the backward pass is written out (`jax.custom_vjp`): autodiff would multiply the float32 cotangent with the
  bfloat16 operand, which XLA upcasts to a float32 matmul. Here the cotangent is rounded to the operand dtype
  first, so both backward matmuls are low-precision too. The weight gradient contracts over tokens; as
  `x^T g` XLA's CPU kernels run it ~4x slower than a batched contraction over token chunks, so it is written
  that way (same sum);
- a weight stored output-major (`w_OxI`, the tied LM head's `[vocab, d_model]` embedding) is contracted on its
  own axis (`transposed=True`), never as `w.T`: XLA then converted and copied the transposed 49,152 x 576 table
  and ran the head's matmul in float32 (SmolLM2 LoRA step at 4 x 256: ~190 ms of ~2,300).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

_WEIGHT_GRAD_CHUNKS = 8


def _dims(transposed: bool):
    """Dimension numbers of `x_TxI` against the weight: `w_IxO` (contract its axis 0) or `w_OxI` (axis 1)."""
    return (((1,), (1 if transposed else 0,)), ((), ()))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def mixed_matmul(x_TxI: jax.Array, w: jax.Array, operand_dtype: str, transposed: bool = False) -> jax.Array:
    """`x_TxI @ w_IxO` (or `x_TxI @ w_OxI.T` when `transposed`) in float32, of both operands rounded to
    `operand_dtype`."""
    op = jnp.dtype(operand_dtype)
    return lax.dot_general(x_TxI.astype(op), w.astype(op), _dims(transposed), preferred_element_type=jnp.float32)


def _forward(x_TxI, w, operand_dtype, transposed):
    op = jnp.dtype(operand_dtype)
    x_op, w_op = x_TxI.astype(op), w.astype(op)
    y_TxO = lax.dot_general(x_op, w_op, _dims(transposed), preferred_element_type=jnp.float32)
    # The residuals keep the rounded operands (half the memory of float32 ones) and the original dtypes.
    return y_TxO, (x_op, w_op, jnp.zeros((0,), x_TxI.dtype), jnp.zeros((0,), w.dtype))


def _backward(operand_dtype, transposed, residuals, dy_TxO):
    x_op, w_op, x_dtype_probe, w_dtype_probe = residuals
    dy_op = dy_TxO.astype(x_op.dtype)
    # dx = dy @ w^T: contract dy's output axis with the weight's output axis.
    dx_TxI = lax.dot_general(dy_op, w_op, (((1,), (0 if transposed else 1,)), ((), ())),
                             preferred_element_type=jnp.float32)
    dw = _weight_grad(x_op, dy_op, transposed)
    return dx_TxI.astype(x_dtype_probe.dtype), dw.astype(w_dtype_probe.dtype)


def _weight_grad(x_TxI: jax.Array, dy_TxO: jax.Array, transposed: bool = False) -> jax.Array:
    """`x^T dy` (float32; `dy^T x` when `transposed`), contracted over token chunks and tokens within a chunk."""
    T = x_TxI.shape[0]
    chunks = _WEIGHT_GRAD_CHUNKS if T % _WEIGHT_GRAD_CHUNKS == 0 else 1
    x_CxTxI = x_TxI.reshape(chunks, T // chunks, x_TxI.shape[1])
    dy_CxTxO = dy_TxO.reshape(chunks, T // chunks, dy_TxO.shape[1])
    spec = "CTI,CTO->OI" if transposed else "CTI,CTO->IO"
    return jnp.einsum(spec, x_CxTxI, dy_CxTxO, preferred_element_type=jnp.float32)


mixed_matmul.defvjp(_forward, _backward)


def matmul(x_TxI: jax.Array, w: jax.Array, operand_dtype: str | None = None, out_dtype=None,
           transposed: bool = False) -> jax.Array:
    """`x_TxI @ w_IxO`, or `x_TxI @ w_OxI.T` when `transposed`. With `operand_dtype` None, or float32 operands,
    a plain matmul (in `out_dtype` when given); otherwise `mixed_matmul` (float32 accumulation), returned in
    `out_dtype`, else in `x_TxI`'s dtype."""
    if operand_dtype is None or jnp.dtype(operand_dtype) == jnp.float32:
        spec = "TI,OI->TO" if transposed else "TI,IO->TO"
        return jnp.einsum(spec, x_TxI, w, preferred_element_type=out_dtype)
    return mixed_matmul(x_TxI, w, operand_dtype, transposed).astype(out_dtype or x_TxI.dtype)


AUTO = "auto"
"""`PipelineConfig.matmul_dtype` / `--matmul-dtype` value: the fastest operand dtype of this host (`fast_operand_dtype`)."""


BF16_DOT_FLAGS = ("amx_bf16", "avx512_bf16")
"""/proc/cpuinfo flags of CPUs that multiply bf16 pairs in hardware (AMX tiles; AVX-512's `vdpbf16ps`)."""


def cpu_multiplies_bf16(cpuinfo: str | None = None) -> bool:
    """Whether the CPU advertises a bf16 dot-product instruction (`BF16_DOT_FLAGS` among /proc/cpuinfo's flags;
    False where it is unreadable)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    return any(line.startswith("flags") and not set(BF16_DOT_FLAGS).isdisjoint(line.split())
               for line in cpuinfo.splitlines())


def fast_operand_dtype(backend: str | None = None, cpuinfo: str | None = None) -> str:
    """The matmul operand dtype that runs fastest here: "bfloat16" on TPUs, GPUs and CPUs that multiply bf16 in
    hardware, "float32" on other CPUs. Measured on 2-core hosts (SmolLM2-135M LoRA step, 4 x 256 tokens): a Xeon
    with AMX ran it 1.37x faster with bf16 operands; an AMD EPYC with `avx512_bf16` (no AMX) 1.47x faster (2.46
    against 3.61 s; its 2048^3 bf16 dot 385 against 209 GFLOP/s); a Xeon with plain AVX-512 1.37x slower (5.2
    against 3.8 s; 208 against 303 GFLOP/s), since XLA then widens bf16 to float32 inside its kernels."""
    backend = backend or jax.default_backend()
    if backend != "cpu":
        return "bfloat16"
    return "bfloat16" if cpu_multiplies_bf16(cpuinfo) else "float32"
