"""Low-rank adapters: `y = W x + (alpha / r) * B(A(dropout(x)))`, B initialised to zero.

The adapter lives in a `lora` submodule of the linear layer it adapts, with `nnx.LoRAParam` leaves, so the
base parameter tree is unchanged and `nnx.state(model, nnx.LoRAParam)` is exactly the adapter. Several
adapters (memory-write, memory-read) share one base by swapping that state (`nnx.update(model, state)`).
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from memllm_jax.config import LoraConfig
from memllm_jax.model import init
from memllm_jax.model.dropout import HashDropout
from memllm_jax.model.matmul import matmul

BASE_PARAMS = nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam))
"""Filter selecting the base parameters only (`nnx.LoRAParam` subclasses `nnx.Param`)."""


def _contract(x: jax.Array, w: jax.Array, n_in: int, out_dtype=None, operand_dtype: str | None = None) -> jax.Array:
    """Contract the last `n_in` axes of `x` with the first `n_in` axes of `w` (`operand_dtype`: see
    `model.matmul.matmul`).

    Done as one 2-D matmul (`[tokens, in] @ [in, out]`): XLA's CPU backend is several times slower on the
    backward pass of dot_generals with several contracting or free dimensions."""
    lead, in_shape, out_shape = x.shape[: x.ndim - n_in], w.shape[:n_in], w.shape[n_in:]
    x_TxI = x.reshape(math.prod(lead), math.prod(in_shape))
    w_IxO = w.reshape(math.prod(in_shape), math.prod(out_shape))
    y_TxO = matmul(x_TxI, w_IxO, operand_dtype, out_dtype)
    return y_TxO.reshape(*lead, *out_shape)


class LoRA(nnx.Module):
    """The adapter of one linear layer whose kernel has shape `in_shape + out_shape`.

    `a` has shape `in_shape + (r,)`, `b` has shape `(r,) + out_shape`. A is initialised like PEFT's default
    (Kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in))), B with zeros.
    """

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        in_axes: Sequence[str | None],
        out_axes: Sequence[str | None],
        cfg: LoraConfig,
        *,
        param_dtype,
        rngs: nnx.Rngs,
    ):
        self.n_in = len(in_shape)
        self.scale = cfg.alpha / cfg.rank
        fan_in = math.prod(in_shape)
        bound = 1.0 / math.sqrt(fan_in)
        a = init.uniform(rngs.params(), (*in_shape, cfg.rank), bound, param_dtype)
        self.a = nnx.LoRAParam(a, logical_axes=(*in_axes, "lora_rank"))
        self.b = nnx.LoRAParam(jnp.zeros((cfg.rank, *out_shape), param_dtype), logical_axes=("lora_rank", *out_axes))
        self.dropout = HashDropout(cfg.dropout, rngs=rngs) if cfg.dropout > 0 else None

    def __call__(self, x: jax.Array, deterministic: bool, operand_dtype: str | None = None) -> jax.Array:
        """`dropout(x) @ scaled_a @ b`; `operand_dtype`: the adapted layer's (`model.matmul.matmul`), as PEFT's
        adapters run under the same autocast as their base layer."""
        if self.dropout is not None:
            x = self.dropout(x, deterministic=deterministic)
        return self.up(_contract(x, self.scaled_a(x.dtype), self.n_in, None, operand_dtype), operand_dtype)

    @property
    def rank(self) -> int:
        return self.a[...].shape[-1]

    def scaled_a(self, dtype) -> jax.Array:
        """`(alpha / r) * A` in `dtype`. The scale goes on the small factor rather than on the `tokens x out`
        output: no extra pass over the activations, forward or backward (exact for a power-of-two scale)."""
        return (self.a[...].astype(jnp.float32) * self.scale).astype(dtype)

    def up(self, h: jax.Array, operand_dtype: str | None = None) -> jax.Array:
        """`h @ B` for `h = x @ scaled_a` of shape `[..., r]`."""
        return _contract(h, self.b[...].astype(h.dtype), 1, None, operand_dtype)

    def sees_input(self, deterministic: bool) -> bool:
        """True when the adapter reads its layer's input unchanged (no dropout mask in this call)."""
        return self.dropout is None or deterministic

    def delta(self, layer: int | None = None) -> jax.Array:
        """(alpha / r) * A B in float32, shaped like the adapted kernel. An adapter of scanned layers has a
        leading layer axis: `layer` picks one row, else the deltas of all layers are returned stacked."""
        a = self.a[...].astype(jnp.float32)
        b = self.b[...].astype(jnp.float32)
        if layer is not None:
            a, b = a[layer], b[layer]
        stacked = a.ndim - self.n_in - 1  # 1 when the layer axis is still there
        if not stacked:
            return _contract(a, b, 1) * self.scale
        return jax.vmap(lambda a_l, b_l: _contract(a_l, b_l, 1))(a, b) * self.scale


def shared_input_hidden(x: jax.Array, adapters: Sequence[LoRA], operand_dtype: str | None = None) -> list[jax.Array]:
    """`[x @ scaled_a for each adapter]` for adapters that read the same input `x` (e.g. those of q, k and v), as
    one matmul over their concatenated A factors. A rank-16 matmul is memory bound on CPU (it costs about a
    read of `x`), so one for all adapters of a shared input, forward and backward (there the input gradients
    `dh @ A^T` of all adapters become one matmul too), instead of one each."""
    n_in = adapters[0].n_in
    if len(adapters) == 1:
        return [_contract(x, adapters[0].scaled_a(x.dtype), n_in, None, operand_dtype)]
    a = jnp.concatenate([adapter.scaled_a(x.dtype) for adapter in adapters], axis=-1)
    h = _contract(x, a, n_in, None, operand_dtype)
    ends = list(itertools.accumulate(adapter.rank for adapter in adapters))
    return [h[..., end - adapter.rank : end] for adapter, end in zip(adapters, ends)]


class TokenLoRA(nnx.Module):
    """Trainable embedding rows for chosen token ids (PEFT `trainable_token_indices`): `delta` is added to
    the base rows, zero-initialised, so the effective row is `embed[id] + delta`."""

    def __init__(self, token_ids: Sequence[int], d_model: int, *, param_dtype):
        self.token_ids = tuple(int(t) for t in token_ids)
        self.delta = nnx.LoRAParam(jnp.zeros((len(self.token_ids), d_model), param_dtype), logical_axes=(None, "embed"))

    def __call__(self, tokens_BxL: jax.Array, x_BxLxD: jax.Array) -> jax.Array:
        onehot_BxLxT = (tokens_BxL[..., None] == jnp.asarray(self.token_ids, tokens_BxL.dtype)).astype(x_BxLxD.dtype)
        return x_BxLxD + jnp.einsum("BLT,TD->BLD", onehot_BxLxT, self.delta[...].astype(x_BxLxD.dtype))

    def add_head_scores(self, x_BxLxD: jax.Array, logits_BxLxV: jax.Array) -> jax.Array:
        """A tied head's logits with the trained rows: `x @ (embed + delta)^T` = `x @ embed^T` plus `x @ delta^T`
        in the trained ids' columns. Written this way, the gradient of `delta` costs T columns, not a full
        vocabulary-by-d_model product through a merged embedding."""
        ids = jnp.asarray(self.token_ids)
        extra_BxLxT = jnp.einsum("BLD,TD->BLT", x_BxLxD, self.delta[...].astype(x_BxLxD.dtype),
                                 preferred_element_type=jnp.float32)
        return logits_BxLxV.at[..., ids].add(extra_BxLxT.astype(logits_BxLxV.dtype))

    def merged_embedding(self, embed_VxD: jax.Array) -> jax.Array:
        ids = jnp.asarray(self.token_ids)
        rows = embed_VxD[ids].astype(jnp.float32) + self.delta[...].astype(jnp.float32)
        return embed_VxD.at[ids].set(rows.astype(embed_VxD.dtype))


def lora_modules(model: nnx.Module) -> list[tuple[tuple, nnx.Module]]:
    """`(path, linear)` for every linear layer of `model` that carries an adapter."""
    return [(path, m) for path, m in nnx.iter_modules(model) if getattr(m, "lora", None) is not None]


def merge_lora(model: nnx.Module) -> None:
    """Fold every adapter (and trainable token rows) into the base weights in place and zero the adapter, so the
    model's function is unchanged."""
    for _, linear in lora_modules(model):
        kernel = linear.kernel[...]
        linear.kernel[...] = (kernel.astype(jnp.float32) + linear.lora.delta()).astype(kernel.dtype)
        linear.lora.b[...] = jnp.zeros_like(linear.lora.b[...])
    token_lora = getattr(model, "token_lora", None)
    if token_lora is not None:
        model.embed[...] = token_lora.merged_embedding(model.embed[...])
        token_lora.delta[...] = jnp.zeros_like(token_lora.delta[...])
