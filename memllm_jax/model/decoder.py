"""The Llama / Mistral-family decoder in flax.nnx (`Decoder`: Mistral-7B, SmolLM2 and any model of that
architecture): embedding, pre-norm blocks (RMSNorm, grouped-query attention with RoPE and an optional
sliding-window causal mask, SwiGLU MLP), final norm, LM head (tied or not); an explicit KV cache pytree.

Letters: B batch, L new tokens, S key slots (cache length or L), D d_model, N query heads, K kv heads,
G = N / K query heads per kv head, M = G * L, H head dim, F MLP width, V vocab, R LoRA rank.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx, struct

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.model import init
from memllm_jax.model.lora import LoRA, TokenLoRA, _contract, shared_input_hidden
from memllm_jax.model.matmul import matmul
from memllm_jax.model.splash import SPLASH_OPTIONS, splash_attention, splash_segments
from memllm_jax.sharding import constrain

NEG_INF = float(jnp.finfo(jnp.float32).min)


@struct.dataclass
class KVCache:
    """Keys/values of every layer; slot index == absolute position; `lengths_B` valid slots per row.

    Keys are stored slots-last (L x B x K x H x S), values slots before the head dim (L x B x K x S x H): per row
    and kv head a step's scores are then the plain product (G x H)(H x S) and its output (G x S)(S x H), with no
    transposed copy of the cache. On a 2-core CPU the one-token attention of 30 layers at 64 rows x 512 slots
    takes ~150 ms this way against ~300 ms on a slots-major (B x S x K x H) cache, and 2-2.7x less from 1 to 64
    rows and 128 to 512 slots; a key layout with the sequence axis last is also one of
    MaxText's decode cache orders."""

    k_LxBxKxHxS: jax.Array
    v_LxBxKxSxH: jax.Array
    lengths_B: jax.Array

    @property
    def max_len(self) -> int:
        k = self.k_LxBxKxHxS
        return k[0].shape[-1] if isinstance(k, (tuple, list)) else k.shape[-1]

    def first_slots(self, n: int) -> "KVCache":
        """The first `n` slots of a stacked cache (a decode step's cost follows the slots it attends to)."""
        return KVCache(self.k_LxBxKxHxS[..., :n], self.v_LxBxKxSxH[:, :, :, :n], self.lengths_B)

    def with_first_slots(self, part: "KVCache") -> "KVCache":
        """This cache with its first slots replaced by those of `part` (a `first_slots` cache run on) and
        `part`'s lengths."""
        n = part.max_len
        return KVCache(self.k_LxBxKxHxS.at[..., :n].set(part.k_LxBxKxHxS),
                       self.v_LxBxKxSxH.at[:, :, :, :n].set(part.v_LxBxKxSxH), part.lengths_B)

    def take_rows(self, rows_G: jax.Array) -> "KVCache":
        """Rows `rows_G` of a stacked cache; an index past the last row reads as an empty row."""
        take = functools.partial(jnp.take, indices=rows_G, mode="fill", fill_value=0)
        return KVCache(take(self.k_LxBxKxHxS, axis=1), take(self.v_LxBxKxSxH, axis=1), take(self.lengths_B, axis=0))

    def put_rows(self, rows_G: jax.Array, part: "KVCache") -> "KVCache":
        """This stacked cache with rows `rows_G` replaced by `part`'s (a `take_rows` cache run on); indices past the
        last row are dropped."""
        return KVCache(self.k_LxBxKxHxS.at[:, rows_G].set(part.k_LxBxKxHxS, mode="drop"),
                       self.v_LxBxKxSxH.at[:, rows_G].set(part.v_LxBxKxSxH, mode="drop"),
                       self.lengths_B.at[rows_G].set(part.lengths_B, mode="drop"))

    def slot_major(self) -> tuple[jax.Array, jax.Array]:
        """`(k_LxBxSxKxH, v_LxBxSxKxH)` of a stacked cache: slot s of row b is `[:, b, s]` (for inspection)."""
        return (jnp.moveaxis(self.k_LxBxKxHxS, -1, 2), jnp.moveaxis(self.v_LxBxKxSxH, 3, 2))


def init_cache(cfg: ModelConfig, batch_size: int, max_len: int | None = None, dtype=None) -> KVCache:
    """An empty cache (all lengths 0) of `max_len` slots (default `cfg.max_seq_len`)."""
    max_len = cfg.max_seq_len if max_len is None else max_len
    dtype = jnp.dtype(cfg.compute_dtype if dtype is None else dtype)
    L, B, K, H = cfg.n_layers, batch_size, cfg.n_kv_heads, cfg.head_dim
    return KVCache(jnp.zeros((L, B, K, H, max_len), dtype), jnp.zeros((L, B, K, max_len, H), dtype),
                   jnp.zeros((batch_size,), jnp.int32))


def unstack_cache(cache: KVCache) -> KVCache:
    """The same cache with `k_LxBxKxHxS` / `v_LxBxKxSxH` as tuples of per-layer arrays (B x K x H x S /
    B x K x S x H), which the model also accepts (and returns in the same form). Decode loops carry this form for
    unrolled models: each layer then attends to its own buffer with no per-step slice of the stacked array. A
    scanned model given this form runs its blocks as a Python loop over static slices of its stacked parameters
    (as fast as the unrolled model on CPU, but every layer's gathered weights are live at once, so decode loops
    keep a scanned model's cache stacked). `stack_cache` undoes it."""
    if isinstance(cache.k_LxBxKxHxS, (tuple, list)):
        return cache
    L = cache.k_LxBxKxHxS.shape[0]
    return KVCache(tuple(cache.k_LxBxKxHxS[i] for i in range(L)), tuple(cache.v_LxBxKxSxH[i] for i in range(L)),
                   cache.lengths_B)


def stack_cache(cache: KVCache) -> KVCache:
    if not isinstance(cache.k_LxBxKxHxS, (tuple, list)):
        return cache
    return KVCache(jnp.stack(cache.k_LxBxKxHxS), jnp.stack(cache.v_LxBxKxSxH), cache.lengths_B)


class Linear(nnx.Module):
    """A kernel of shape `in_shape + out_shape` contracted over the input's trailing `len(in_shape)` axes,
    with an optional LoRA adapter (`self.lora`)."""

    def __init__(
        self,
        in_shape: Sequence[int],
        out_shape: Sequence[int],
        in_axes: Sequence[str | None],
        out_axes: Sequence[str | None],
        *,
        cfg: ModelConfig,
        lora: LoraConfig | None,
        std: float,
        rngs: nnx.Rngs,
        lora_rngs: nnx.Rngs,
    ):
        self.n_in = len(in_shape)
        self.operand_dtype = cfg.operand_dtype
        dtype = jnp.dtype(cfg.param_dtype)
        kernel = init.normal(rngs.params(), (*in_shape, *out_shape), std, dtype)
        self.kernel = nnx.Param(kernel, logical_axes=(*in_axes, *out_axes))
        self.lora = (
            LoRA(in_shape, out_shape, in_axes, out_axes, lora, param_dtype=dtype, rngs=lora_rngs) if lora is not None else None
        )

    def __call__(self, x: jax.Array, deterministic: bool = True, out_dtype=None) -> jax.Array:
        y = self.base(x, out_dtype)
        if self.lora is not None:
            y = y + self.lora(x, deterministic, self.operand_dtype).astype(y.dtype)
        return y

    def base(self, x: jax.Array, out_dtype=None) -> jax.Array:
        """The frozen kernel's part, `x @ kernel`."""
        return _contract(x, self.kernel[...], self.n_in, out_dtype, self.operand_dtype)


def project(x: jax.Array, linears: Sequence[Linear], deterministic: bool) -> list[jax.Array]:
    """`[linear(x, deterministic) for linear in linears]` for linears that read the same `x` (q, k, v; gate, up):
    the adapters that see `x` unchanged (no dropout in this call) apply their A factors as one matmul
    (`lora.shared_input_hidden`); the others apply themselves."""
    ys = [linear.base(x) for linear in linears]
    shared = [i for i, linear in enumerate(linears) if linear.lora is not None and linear.lora.sees_input(deterministic)]
    if shared:
        operand_dtype = linears[shared[0]].operand_dtype
        hidden = shared_input_hidden(x, [linears[i].lora for i in shared], operand_dtype)
        for i, h in zip(shared, hidden):
            ys[i] = ys[i] + linears[i].lora.up(h, operand_dtype).astype(ys[i].dtype)
    for i, linear in enumerate(linears):
        if linear.lora is not None and i not in shared:
            ys[i] = ys[i] + linear.lora(x, deterministic, linear.operand_dtype).astype(ys[i].dtype)
    return ys


def set_matmul_dtype(model: nnx.Module, matmul_dtype: str | None) -> None:
    """Run `model`'s linear layers and LM head with `matmul_dtype` operands from now on (`ModelConfig.
    matmul_dtype`; the weights are unchanged): updates `model.cfg` and every `Linear`."""
    model.cfg = dataclasses.replace(model.cfg, matmul_dtype=matmul_dtype)
    for _, module in nnx.iter_modules(model):
        if isinstance(module, Linear):
            module.operand_dtype = model.cfg.operand_dtype


class RMSNorm(nnx.Module):
    def __init__(self, cfg: ModelConfig):
        self.eps = cfg.norm_eps
        self.scale = nnx.Param(jnp.ones((cfg.d_model,), jnp.dtype(cfg.param_dtype)), logical_axes=("norm",))

    def __call__(self, x_BxLxD: jax.Array) -> jax.Array:
        x = x_BxLxD.astype(jnp.float32)
        x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.eps)
        return self.scale[...].astype(x_BxLxD.dtype) * x.astype(x_BxLxD.dtype)


def rope_tables(positions_BxL: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """cos and sin of shape B x L x H (the two halves repeat, as in the rotate-half convention)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs_BxLxH2 = positions_BxL.astype(jnp.float32)[..., None] * inv_freq
    emb_BxLxH = jnp.concatenate([freqs_BxLxH2, freqs_BxLxH2], axis=-1)
    return jnp.cos(emb_BxLxH), jnp.sin(emb_BxLxH)


def apply_rope(x_BxLxNxH: jax.Array, cos_BxLxH: jax.Array, sin_BxLxH: jax.Array) -> jax.Array:
    half = x_BxLxNxH.shape[-1] // 2
    rotated = jnp.concatenate([-x_BxLxNxH[..., half:], x_BxLxNxH[..., :half]], axis=-1)
    cos, sin = cos_BxLxH[:, :, None, :].astype(x_BxLxNxH.dtype), sin_BxLxH[:, :, None, :].astype(x_BxLxNxH.dtype)
    return x_BxLxNxH * cos + rotated * sin


def _targets(lora: LoraConfig | None, name: str) -> LoraConfig | None:
    return lora if lora is not None and name in lora.targets else None


ATTENTION_IMPLEMENTATIONS = {"einsum": "einsum", "xla": "xla", "cudnn": "cudnn", "auto": None,
                             "splash": "splash", "splash_interpret": "splash_interpret"}
"""`ModelConfig.attention` -> the `implementation` argument of `jax.nn.dot_product_attention` ("einsum": ours;
"splash", "splash_interpret": the Pallas kernel of `memllm_jax/model/splash.py`)."""


def grouped_attention(q_BxLxNxH, k_BxKxHxS, v_BxKxSxH, mask_BxLxS, n_kv: int) -> jax.Array:
    """Softmax attention on keys / values in the cache's layout (`KVCache`) as canonical batched matmuls over
    (B, K) with the G query heads of a kv head folded into the rows (M = G * L): no repeated K/V, and XLA's CPU
    matmuls run ~2x faster than on 5-D einsums. Scores and softmax in float32; the output has the query's
    dtype. A one-token step (L = 1) is the same two products with M = G."""
    B, L, N, H = q_BxLxNxH.shape
    K, G, S = n_kv, N // n_kv, k_BxKxHxS.shape[-1]
    q_BxKxMxH = (q_BxLxNxH * jnp.asarray(H**-0.5, q_BxLxNxH.dtype)).reshape(B, L, K, G, H)
    q_BxKxMxH = q_BxKxMxH.transpose(0, 2, 3, 1, 4).reshape(B, K, G * L, H)
    k_BxKxHxS = k_BxKxHxS.astype(q_BxKxMxH.dtype)
    v_BxKxSxH = v_BxKxSxH.astype(q_BxKxMxH.dtype)
    scores = jnp.einsum("BKMH,BKHS->BKMS", q_BxKxMxH, k_BxKxHxS, preferred_element_type=jnp.float32)
    scores_BxKxGxLxS = jnp.where(mask_BxLxS[:, None, None], scores.reshape(B, K, G, L, S), NEG_INF)
    probs_BxKxMxS = jax.nn.softmax(scores_BxKxGxLxS, axis=-1).astype(v_BxKxSxH.dtype).reshape(B, K, G * L, S)
    out_BxKxMxH = jnp.einsum("BKMS,BKSH->BKMH", probs_BxKxMxS, v_BxKxSxH)
    return out_BxKxMxH.reshape(B, K, G, L, H).transpose(0, 3, 1, 2, 4).reshape(B, L, K * G, H)


def cache_layout(k_BxLxKxH, v_BxLxKxH) -> tuple[jax.Array, jax.Array]:
    """New keys / values (B x L x K x H) in the cache's layout: `(k_BxKxHxL, v_BxKxLxH)`."""
    return k_BxLxKxH.transpose(0, 2, 3, 1), v_BxLxKxH.transpose(0, 2, 1, 3)


def causal_blocks(q_BxLxNxH, k_BxKxHxL, v_BxKxLxH, mask_BxLxL, block: int, n_kv: int) -> jax.Array:
    """`grouped_attention` of a cache-free forward (keys = the queries' own tokens), one block of `block` queries
    at a time against the keys up to the block's end. The skipped scores lie above the diagonal, where a key
    comes after its query: the causal mask drops them whenever positions increase along each segment (packed
    segments restart at 0, and the segment mask drops every pair across them; a shared prefix comes from an
    earlier segment of the row). With n blocks the products cover (n + 1) / 2n of the full square."""
    L = q_BxLxNxH.shape[1]
    outs = []
    for start in range(0, L, block):
        end = min(start + block, L)
        outs.append(grouped_attention(q_BxLxNxH[:, start:end], k_BxKxHxL[..., :end], v_BxKxLxH[:, :, :end],
                                      mask_BxLxL[:, start:end, :end], n_kv))
    return jnp.concatenate(outs, axis=1)


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, lora: LoraConfig | None, *, rngs: nnx.Rngs, lora_rngs: nnx.Rngs):
        D, N, K, H = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        if N % K:
            raise ValueError(f"ModelConfig.n_heads={N} is not a multiple of ModelConfig.n_kv_heads={K}")
        if cfg.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"ModelConfig.attention={cfg.attention!r}; expected one of {sorted(ATTENTION_IMPLEMENTATIONS)}")
        self.n_kv, self.group, self.head_dim = K, N // K, H
        self.implementation = ATTENTION_IMPLEMENTATIONS[cfg.attention]
        self.sliding_window = cfg.sliding_window
        self.query_block = cfg.attention_block
        out_std = 1.0 / math.sqrt(N * H) / math.sqrt(2 * cfg.n_layers)
        kw = dict(cfg=cfg, rngs=rngs, lora_rngs=lora_rngs)
        self.q = Linear((D,), (N, H), ("embed",), ("q_heads", "head_dim"), lora=_targets(lora, "q"), std=D**-0.5, **kw)
        self.k = Linear((D,), (K, H), ("embed",), ("kv_heads", "head_dim"), lora=_targets(lora, "k"), std=D**-0.5, **kw)
        self.v = Linear((D,), (K, H), ("embed",), ("kv_heads", "head_dim"), lora=_targets(lora, "v"), std=D**-0.5, **kw)
        self.o = Linear((N, H), (D,), ("q_heads", "head_dim"), ("embed",), lora=_targets(lora, "o"), std=out_std, **kw)

    def __call__(self, x_BxLxD, cos_BxLxH, sin_BxLxH, mask_BxLxS, segments_BxL, cache_kv, write_BxL, deterministic):
        """`segments_BxL`: the splash kernel's segment ids (`splash_segments`; None unless the model runs
        splash attention without a cache: `mask_BxLxS` then carries the same mask for the other paths).
        `cache_kv` is None (keys = the new tokens), `(k_LxBxKxHxS, v_LxBxKxSxH, layer)` (the stacked
        caches of every layer and this layer's index) or `(k_BxKxHxS, v_BxKxSxH, None)` (this layer's own
        arrays, see `unstack_cache`). The new keys/values are scattered straight into the given arrays
        (no per-layer copy and re-stack), so inside a jitted loop XLA updates the carried cache in place."""
        B, L, _ = x_BxLxD.shape
        q_BxLxNxH, k_BxLxKxH, v_BxLxKxH = project(x_BxLxD, (self.q, self.k, self.v), deterministic)
        q_BxLxNxH = apply_rope(q_BxLxNxH, cos_BxLxH, sin_BxLxH)
        k_BxLxKxH = apply_rope(k_BxLxKxH, cos_BxLxH, sin_BxLxH)
        q_BxLxNxH = constrain(q_BxLxNxH, ("batch", "seq", "q_heads", "head_dim"))
        if cache_kv is None:
            new_kv = (k_BxLxKxH, v_BxLxKxH)
            if segments_BxL is not None:  # splash, cache-free
                out_BxLxNxH = splash_attention(
                    q_BxLxNxH, k_BxLxKxH, v_BxLxKxH, segments_BxL, sliding_window=self.sliding_window,
                    interpret=self.implementation == "splash_interpret", option=self.implementation)
                return self.o(out_BxLxNxH, deterministic), new_kv
            if self.implementation not in ("einsum", *SPLASH_OPTIONS):
                out_BxLxNxH = jax.nn.dot_product_attention(
                    q_BxLxNxH, k_BxLxKxH.astype(q_BxLxNxH.dtype), v_BxLxKxH.astype(q_BxLxNxH.dtype),
                    mask=mask_BxLxS[:, None], implementation=self.implementation)
                return self.o(out_BxLxNxH, deterministic), new_kv
            k_BxKxHxS, v_BxKxSxH = cache_layout(k_BxLxKxH, v_BxLxKxH)
        else:
            # Scatter the new keys/values at slots lengths_B[b] + i; out-of-range slots are dropped. The advanced
            # indices (rows, slots) are split by the head slices, so the updates are indexed (B, L, K, H).
            k_all, v_all, layer = cache_kv
            rows_Bx1, S_ = jnp.arange(B)[:, None], slice(None)
            k_at = (rows_Bx1, S_, S_, write_BxL) if layer is None else (layer, rows_Bx1, S_, S_, write_BxL)
            v_at = (rows_Bx1, S_, write_BxL) if layer is None else (layer, rows_Bx1, S_, write_BxL)
            k_all = k_all.at[k_at].set(k_BxLxKxH.astype(k_all.dtype), mode="drop")
            v_all = v_all.at[v_at].set(v_BxLxKxH.astype(v_all.dtype), mode="drop")
            k_BxKxHxS, v_BxKxSxH = (k_all, v_all) if layer is None else (k_all[layer], v_all[layer])
            new_kv = (k_all, v_all)
            if self.implementation not in ("einsum", *SPLASH_OPTIONS):
                out_BxLxNxH = jax.nn.dot_product_attention(  # in jax's layout, B x S x K x H
                    q_BxLxNxH, jnp.moveaxis(k_BxKxHxS, -1, 1).astype(q_BxLxNxH.dtype),
                    v_BxKxSxH.transpose(0, 2, 1, 3).astype(q_BxLxNxH.dtype),
                    mask=mask_BxLxS[:, None], implementation=self.implementation)
                return self.o(out_BxLxNxH, deterministic), new_kv
        K = self.n_kv
        if cache_kv is None and 0 < self.query_block < L:
            out_BxLxNxH = causal_blocks(q_BxLxNxH, k_BxKxHxS, v_BxKxSxH, mask_BxLxS, self.query_block, K)
        else:
            out_BxLxNxH = grouped_attention(q_BxLxNxH, k_BxKxHxS, v_BxKxSxH, mask_BxLxS, K)
        return self.o(out_BxLxNxH, deterministic), new_kv


class MLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, lora: LoraConfig | None, *, rngs: nnx.Rngs, lora_rngs: nnx.Rngs):
        D, F = cfg.d_model, cfg.d_ff
        kw = dict(cfg=cfg, rngs=rngs, lora_rngs=lora_rngs)
        self.gate = Linear((D,), (F,), ("embed",), ("mlp",), lora=_targets(lora, "gate"), std=D**-0.5, **kw)
        self.up = Linear((D,), (F,), ("embed",), ("mlp",), lora=_targets(lora, "up"), std=D**-0.5, **kw)
        down_std = F**-0.5 / math.sqrt(2 * cfg.n_layers)
        self.down = Linear((F,), (D,), ("mlp",), ("embed",), lora=_targets(lora, "down"), std=down_std, **kw)

    def __call__(self, x_BxLxD, deterministic):
        gate_BxLxF, up_BxLxF = project(x_BxLxD, (self.gate, self.up), deterministic)
        h_BxLxF = jax.nn.silu(gate_BxLxF) * up_BxLxF
        h_BxLxF = constrain(h_BxLxF, ("batch", "seq", "mlp"))
        return self.down(h_BxLxF, deterministic)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, lora: LoraConfig | None, *, rngs: nnx.Rngs, lora_rngs: nnx.Rngs):
        self.attn_norm = RMSNorm(cfg)
        self.attn = Attention(cfg, lora, rngs=rngs, lora_rngs=lora_rngs)
        self.mlp_norm = RMSNorm(cfg)
        self.mlp = MLP(cfg, lora, rngs=rngs, lora_rngs=lora_rngs)

    def __call__(self, x_BxLxD, cos, sin, mask_BxLxS, segments_BxL, cache_kv, write_BxL, deterministic):
        h_BxLxD, kv = self.attn(self.attn_norm(x_BxLxD), cos, sin, mask_BxLxS, segments_BxL, cache_kv, write_BxL,
                                deterministic)
        x_BxLxD = constrain(x_BxLxD + h_BxLxD, ("batch", "seq", "embed_act"))
        x_BxLxD = x_BxLxD + self.mlp(self.mlp_norm(x_BxLxD), deterministic)
        return constrain(x_BxLxD, ("batch", "seq", "embed_act")), kv


def _run_block(block, x, cos, sin, mask, segments, cache_kv, write, deterministic):
    return block(x, cos, sin, mask, segments, cache_kv, write, deterministic)


def remat_policy(cfg: ModelConfig):
    """`ModelConfig.remat_policy` as a `jax.checkpoint_policies` function."""
    policy = getattr(jax.checkpoint_policies, cfg.remat_policy, None)
    if policy is None or cfg.remat_policy.startswith("_"):
        raise ValueError(f"ModelConfig.remat_policy={cfg.remat_policy!r} is not a name in jax.checkpoint_policies")
    return policy


LAYERS_AXIS = "layers"
"""Logical name of the leading axis of scanned (stacked) layer parameters; replicated by the sharding rules."""


def stack_blocks(blocks: Sequence[Block]) -> Block:
    """One Block whose every variable has a leading layer axis, row i taken from `blocks[i]` (so a seed gives
    the same weights whether the layers are scanned or not)."""
    graphdef = nnx.graphdef(blocks[0])
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b) for b in blocks])
    for _, var in nnx.to_flat_state(stacked):
        logical = var.get_metadata().get("logical_axes")
        if logical is not None:
            var.set_metadata("logical_axes", (LAYERS_AXIS, *logical))
    return nnx.merge(graphdef, stacked)


def stack_layers(model: "Decoder") -> None:
    """Give an unrolled `model` scanned layers in place (`ModelConfig.scan_layers`): the same weights, stacked, so
    each jitted forward compiles one block instead of every layer. An evaluation's scoring and prefill forwards
    come in many padded shapes: unrolled, SmolLM2's 30 layers took 3-6 s to compile per shape on a 2-core CPU,
    about a quarter of the main job's time."""
    if model.cfg.scan_layers:
        return
    model.layers = stack_blocks(list(model.layers))
    model.cfg = dataclasses.replace(model.cfg, scan_layers=True)


def unstack_blocks(stack: Block, n_layers: int) -> list[Block]:
    """The inverse of `stack_blocks`: one Block per row (their variables are static slices of the stack)."""
    graphdef, state = nnx.split(stack)
    return [nnx.merge(graphdef, jax.tree.map(lambda a: a[i], state)) for i in range(n_layers)]


def _scan_blocks(stack: Block, cfg: ModelConfig, x_BxLxD, cos, sin, mask_BxLxS, segments_BxL, cache_kv, write_BxL,
                 deterministic):
    """Run the stacked blocks with `jax.lax.scan` (rematerialised by `cfg.remat_policy` when training).
    `cache_kv` is None or the stacked `(k_LxBxKxHxS, v_LxBxKxSxH)`, carried whole and updated in place at the
    scanned layer index. Returns `(x_BxLxD, (k, v) or None)`; the blocks' dropout counters are updated."""
    graphdef, state = nnx.split(stack)

    def block_fn(state_l, layer, x_BxLxD, kv):
        block = nnx.merge(graphdef, state_l)
        x_BxLxD, kv = block(x_BxLxD, cos, sin, mask_BxLxS, segments_BxL, None if kv is None else (*kv, layer),
                            write_BxL, deterministic)
        return x_BxLxD, kv, nnx.state(block, nnx.RngState)

    if cfg.remat and cache_kv is None:
        block_fn = jax.checkpoint(block_fn, policy=remat_policy(cfg), prevent_cse=False)

    def body(carry, xs):
        x_BxLxD, kv = carry
        x_BxLxD, new_kv, rng_state = block_fn(*xs, x_BxLxD, kv)
        return (x_BxLxD, None if kv is None else new_kv), rng_state

    layers = jnp.arange(cfg.n_layers, dtype=jnp.int32)
    (x_BxLxD, cache_kv), rng_state = jax.lax.scan(body, (x_BxLxD, cache_kv), (state, layers))
    if not deterministic:  # only dropout advances the counters; no tracers leak into a model closed over
        nnx.update(stack, rng_state)
    return x_BxLxD, cache_kv


class Decoder(nnx.Module):
    """The decoder. See docs/interfaces.md (Model) for the calling convention."""

    def __init__(self, cfg: ModelConfig, lora: LoraConfig | None = None, *, rngs: nnx.Rngs):
        if lora is not None:
            unknown = set(lora.targets) - {"q", "k", "v", "o", "gate", "up", "down", "lm_head"}
            if unknown:
                raise ValueError(f"LoraConfig.targets: unknown target(s) {sorted(unknown)}")
        self.cfg = cfg
        self.lora_cfg = lora
        dtype = jnp.dtype(cfg.param_dtype)
        # Separate streams: the base weights for a seed do not depend on whether LoRA is present.
        base_key, lora_key = rngs.params(), rngs.params()
        lora_rngs = nnx.Rngs(params=lora_key, dropout=rngs.dropout())
        rngs = nnx.Rngs(params=base_key)
        embedding = init.normal(rngs.params(), (cfg.vocab_size, cfg.d_model), 1.0, dtype)
        self.embed = nnx.Param(embedding, logical_axes=("vocab", "embed"))
        trainable = () if lora is None else lora.trainable_tokens
        bad = [t for t in trainable if not 0 <= t < cfg.vocab_size]
        if bad:
            raise ValueError(f"LoraConfig.trainable_tokens: ids {bad} are outside the vocabulary (0..{cfg.vocab_size - 1})")
        self.token_lora = TokenLoRA(trainable, cfg.d_model, param_dtype=dtype) if trainable else None
        blocks = [Block(cfg, lora, rngs=rngs, lora_rngs=lora_rngs) for _ in range(cfg.n_layers)]
        # Scanned: one Block whose variables are stacked on a leading layer axis; else a list of Blocks.
        self.layers = stack_blocks(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.final_norm = RMSNorm(cfg)
        if cfg.tie_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(
                (cfg.d_model,), (cfg.vocab_size,), ("embed",), ("vocab",), cfg=cfg,
                lora=_targets(lora, "lm_head"), std=cfg.d_model**-0.5, rngs=rngs, lora_rngs=lora_rngs,
            )

    def __call__(
        self,
        tokens_BxL: jax.Array,
        positions_BxL: jax.Array,
        attn_mask_BxL: jax.Array | None = None,
        cache: KVCache | None = None,
        deterministic: bool = True,
        segment_ids_BxL: jax.Array | None = None,
        return_hidden: bool = False,
        prefix_segment_ids_BxL: jax.Array | None = None,
        prefix_lengths_BxL: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """`segment_ids_BxL` (no cache only): several examples packed in a row, each with its own positions
        from 0; a token attends only to earlier tokens of its own segment. `prefix_segment_ids_BxL` /
        `prefix_lengths_BxL` (with segments; 0 = none): a token also attends to the tokens of that segment at
        positions below that length, a prefix it shares with an earlier segment of the row (`train.data`'s
        "pack_prefixes"; that segment must come first in the row). `return_hidden`: return the final hidden
        states `x_BxLxD` instead of the logits (for `head` at chosen positions only, e.g. the loss's)."""
        cfg = self.cfg
        B, L = tokens_BxL.shape
        compute = jnp.dtype(cfg.compute_dtype)
        if attn_mask_BxL is None:
            attn_mask_BxL = jnp.ones((B, L), bool)
        attn_mask_BxL = attn_mask_BxL.astype(bool)
        positions_BxL = positions_BxL.astype(jnp.int32)
        x_BxLxD = jnp.take(self.embed[...], tokens_BxL, axis=0).astype(compute)
        if self.token_lora is not None:
            x_BxLxD = self.token_lora(tokens_BxL, x_BxLxD)
        x_BxLxD = constrain(x_BxLxD, ("batch", "seq", "embed_act"))
        cos, sin = rope_tables(positions_BxL, cfg.head_dim, cfg.rope_theta)

        if cache is None:
            key_pos_BxS, key_ok_BxS, write_BxL = positions_BxL, attn_mask_BxL, None
        else:
            S = cache.max_len
            new_lengths_B = cache.lengths_B + attn_mask_BxL.sum(-1).astype(jnp.int32)
            key_pos_BxS = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S))
            key_ok_BxS = key_pos_BxS < new_lengths_B[:, None]
            write_BxL = jnp.where(attn_mask_BxL, cache.lengths_B[:, None] + jnp.arange(L, dtype=jnp.int32), S)
        delta_BxLxS = positions_BxL[:, :, None] - key_pos_BxS[:, None, :]
        mask_BxLxS = key_ok_BxS[:, None, :] & (delta_BxLxS >= 0)
        if cfg.sliding_window is not None:
            mask_BxLxS &= delta_BxLxS < cfg.sliding_window
        if segment_ids_BxL is not None:
            if cache is not None:
                raise ValueError("segment_ids_BxL (packed examples) is for cache-free forwards only")
            mask_BxLxS &= segment_ids_BxL[:, :, None] == segment_ids_BxL[:, None, :]
            if prefix_segment_ids_BxL is not None:
                shared_BxLxS = ((segment_ids_BxL[:, None, :] == prefix_segment_ids_BxL[:, :, None])
                                & (key_pos_BxS[:, None, :] < prefix_lengths_BxL[:, :, None]) & key_ok_BxS[:, None, :])
                if cfg.sliding_window is not None:
                    shared_BxLxS &= delta_BxLxS < cfg.sliding_window
                mask_BxLxS |= shared_BxLxS
        # The splash kernel takes causality and the window as static masks, padding and packing as segment ids.
        segments_BxL = None
        if cache is None and cfg.attention in SPLASH_OPTIONS:
            if prefix_segment_ids_BxL is not None:
                raise ValueError(f"shared prefixes (packing 'pack_prefixes') need ModelConfig.attention 'einsum', "
                                 f"'xla' or 'cudnn', not {cfg.attention!r}: the splash kernel masks by segment ids")
            segments_BxL = splash_segments(attn_mask_BxL, segment_ids_BxL)

        layered = cache is not None and isinstance(cache.k_LxBxKxHxS, (tuple, list))
        if cfg.scan_layers and not layered:  # training, prefill, one-shot forwards
            kv = None if cache is None else (cache.k_LxBxKxHxS, cache.v_LxBxKxSxH)
            x_BxLxD, kv = _scan_blocks(self.layers, cfg, x_BxLxD, cos, sin, mask_BxLxS, segments_BxL, kv, write_BxL,
                                        deterministic)
            k_all, v_all = (None, None) if kv is None else kv
        else:
            x_BxLxD, k_all, v_all = self._loop_blocks(x_BxLxD, cos, sin, mask_BxLxS, segments_BxL, cache, write_BxL,
                                                      deterministic)
        x_BxLxD = self.final_norm(x_BxLxD)
        if cache is not None:
            cache = KVCache(k_all, v_all, new_lengths_B)
        if return_hidden:
            return x_BxLxD, cache
        return self.head(x_BxLxD, deterministic), cache

    def head(self, x_BxLxD: jax.Array, deterministic: bool = True) -> jax.Array:
        """Float32 logits `[B, L, V]` of final hidden states (any leading shape `[B, L]`)."""
        if self.lm_head is None:
            lead, D = x_BxLxD.shape[:-1], x_BxLxD.shape[-1]
            logits = matmul(x_BxLxD.reshape(-1, D), self.embed[...], self.cfg.operand_dtype, jnp.float32,
                            transposed=True).reshape(*lead, -1)
            if self.token_lora is not None:  # trained rows score as they embed, as after merge_lora
                logits = self.token_lora.add_head_scores(x_BxLxD, logits)
        else:
            logits = self.lm_head(x_BxLxD, deterministic, out_dtype=jnp.float32)
        return constrain(logits.astype(jnp.float32), ("batch", "seq", "vocab"))

    def _loop_blocks(self, x_BxLxD, cos, sin, mask_BxLxS, segments_BxL, cache, write_BxL, deterministic):
        """The unrolled form: a Python loop over the blocks (static slices of scanned ones). Returns
        `(x_BxLxD, k, v)`, the cache arrays in the form given (stacked or per-layer tuples; None without one)."""
        cfg = self.cfg
        if cfg.remat and cache is None:
            run = nnx.remat(_run_block, static_argnums=(8,), policy=remat_policy(cfg))
        else:
            run = _run_block
        layered = cache is not None and isinstance(cache.k_LxBxKxHxS, (tuple, list))
        k_all = v_all = None
        if cache is not None:
            k_all, v_all = cache.k_LxBxKxHxS, cache.v_LxBxKxSxH
            new_k, new_v = list(k_all) if layered else None, list(v_all) if layered else None
        blocks = unstack_blocks(self.layers, cfg.n_layers) if cfg.scan_layers else self.layers
        for i, block in enumerate(blocks):
            if cache is None:
                cache_kv = None
            elif layered:
                cache_kv = (new_k[i], new_v[i], None)
            else:
                cache_kv = (k_all, v_all, i)
            x_BxLxD, (k, v) = run(block, x_BxLxD, cos, sin, mask_BxLxS, segments_BxL, cache_kv, write_BxL,
                                  deterministic)
            if layered:
                new_k[i], new_v[i] = k, v
            elif cache is not None:
                k_all, v_all = k, v
        if layered:
            k_all, v_all = tuple(new_k), tuple(new_v)
        if cfg.scan_layers and not deterministic:
            nnx.update(self.layers, jax.tree.map(lambda *xs: jnp.stack(xs), *[nnx.state(b, nnx.RngState) for b in blocks]))
        return x_BxLxD, k_all, v_all

