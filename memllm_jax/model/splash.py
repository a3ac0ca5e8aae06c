"""The Pallas splash-attention kernel (`jax.experimental.pallas.ops.tpu.splash_attention`) for
`ModelConfig.attention="splash"`: flash attention on TPUs for cache-free forwards (training, packed rows,
one-shot forwards). Forwards on a KV cache keep the reference path (see `Attention`).

What the model's boolean mask says is handed to the kernel in its own terms:
- causal and sliding window: a static mask per head, `CausalMask`, or `LocalMask` with window
  `(sliding_window - 1, 0)` (a key at most `sliding_window - 1` tokens back, none ahead);
- packed examples and padding: segment ids (`splash_segments`); padding tokens get an id no example has,
  so no real token attends to them.
The kernel compares token *indices*, the reference compares *positions*: the two agree when, within a
segment, positions count up by one per token (`positions[i] - positions[j] == i - j`), which is how every
cache-free forward here lays out its rows (`train/data.py`: each example's positions from 0; eval: arange).

The kernel tiles the sequence in blocks of 128, 256 or 512 tokens, so the wrapper pads L up to a multiple of
128 and slices the output back. The padded tail comes after every real token, so the causal mask keeps it
out of their attention; its own rows are discarded (and get zero cotangents). Block sizes are not tuned
(no TPU here). Letters as in `decoder.py`; P = L padded.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from memllm_jax.sharding import AXES, logical_to_spec

SPLASH_OPTIONS = ("splash", "splash_interpret")
"""`ModelConfig.attention` values served by this module; "splash_interpret" runs the same kernel in Pallas
interpret mode (any backend, slow: for tests and debugging)."""

_TILE = 128  # the kernel's lane width: every block size is a multiple of it


def splash_segments(attn_mask_BxL: jax.Array, segment_ids_BxL: jax.Array | None) -> jax.Array:
    """Segment ids for the kernel: the given ones (or 0, one example per row) on real tokens, and on padding
    (`attn_mask_BxL` False) one id below the smallest real one, so padding is in no example's segment."""
    if segment_ids_BxL is None:
        seg_BxL = jnp.zeros(attn_mask_BxL.shape, jnp.int32)
    else:
        seg_BxL = segment_ids_BxL.astype(jnp.int32)
    pad_id = jnp.min(jnp.where(attn_mask_BxL, seg_BxL, jnp.iinfo(jnp.int32).max)) - 1
    return jnp.where(attn_mask_BxL, seg_BxL, pad_id)


def _block_sizes(P: int):
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b = next(b for b in (512, 256, 128) if P % b == 0)
    return sa.BlockSizes(block_q=b, block_kv=b, block_kv_compute=b, block_q_dkv=b, block_kv_dkv=b,
                         block_kv_dkv_compute=b, block_q_dq=b, block_kv_dq=b)


def _local_attention(q_BxLxNxH, k_BxLxKxH, v_BxLxKxH, seg_BxL, *, sliding_window, interpret):
    """The kernel on the arrays of one device (or the whole arrays without a mesh)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa  # imported when used (~0.1 s)

    B, L, N, H = q_BxLxNxH.shape
    P = -(-L // _TILE) * _TILE
    pad = ((0, 0), (0, 0), (0, P - L), (0, 0))
    # Pre-scaled as the reference does (the kernel applies no softmax scale).
    q_BxNxPxH = jnp.pad((q_BxLxNxH * jnp.asarray(H**-0.5, q_BxLxNxH.dtype)).transpose(0, 2, 1, 3), pad)
    k_BxKxPxH = jnp.pad(k_BxLxKxH.astype(q_BxLxNxH.dtype).transpose(0, 2, 1, 3), pad)
    v_BxKxPxH = jnp.pad(v_BxLxKxH.astype(q_BxLxNxH.dtype).transpose(0, 2, 1, 3), pad)
    seg_BxP = jnp.pad(seg_BxL, ((0, 0), (0, P - L)))
    if sliding_window is None:
        mask = sa.CausalMask((P, P))
    else:
        mask = sa.LocalMask((P, P), window_size=(sliding_window - 1, 0), offset=0)
    # Built per call (cheap: the mask's block structure is lru-cached inside splash_attention_mask_info);
    # its arrays are constants of the traced function, so the kernel object must not outlive the trace.
    kernel = sa.make_splash_mha(sa.MultiHeadMask([mask] * N), block_sizes=_block_sizes(P), head_shards=1,
                                q_seq_shards=1, interpret=interpret)
    per_row = jax.vmap(lambda q, k, v, s: kernel(q, k, v, sa.SegmentIds(s, s)))
    out_BxNxPxH = per_row(q_BxNxPxH, k_BxKxPxH, v_BxKxPxH, seg_BxP)
    return out_BxNxPxH[:, :, :L].transpose(0, 2, 1, 3)


def splash_attention(q_BxLxNxH, k_BxLxKxH, v_BxLxKxH, seg_BxL, *, sliding_window: int | None, interpret: bool,
                     option: str = "splash") -> jax.Array:
    """Causal (optionally sliding-window) grouped-query attention within segments (`splash_segments`),
    softmax scale `1/sqrt(H)`; returns `out_BxLxNxH` in `q`'s dtype.

    Under a mesh (`jax.set_mesh`) the kernel runs per device through `jax.shard_map`: a Pallas call is opaque
    to XLA's partitioner, which would otherwise gather the whole batch onto every device. Each device gets
    its rows (the "batch" mesh axes) and its heads ("tensor": a contiguous run of query heads and exactly the
    kv heads they read, since N/T query heads per device = (K/T) * G), i.e. the specs `constrain` gives these
    arrays; the sequence is never split (the kernel's mask covers the whole row)."""
    if not interpret and jax.default_backend() != "tpu":
        raise ValueError(f"ModelConfig.attention={option!r} runs the Pallas splash kernel, which compiles for TPUs "
                         f"only (backend here: {jax.default_backend()!r}); use 'splash_interpret' to run it in "
                         "Pallas interpret mode, or 'einsum' / 'xla'")

    def attend(q, k, v, seg):
        return _local_attention(q, k, v, seg, sliding_window=sliding_window, interpret=interpret)

    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not set(AXES) <= set(mesh.axis_names):
        return attend(q_BxLxNxH, k_BxLxKxH, v_BxLxKxH, seg_BxL)
    q_spec = logical_to_spec(("batch", "seq", "q_heads", "head_dim"), q_BxLxNxH.shape, mesh)
    kv_spec = logical_to_spec(("batch", "seq", "kv_heads", "head_dim"), k_BxLxKxH.shape, mesh)
    seg_spec = logical_to_spec(("batch", "seq"), seg_BxL.shape, mesh)
    # check_vma=False: pallas_call does not declare how its outputs vary over the mesh axes.
    sharded = jax.shard_map(attend, in_specs=(q_spec, kv_spec, kv_spec, seg_spec), out_specs=q_spec, check_vma=False)
    return sharded(q_BxLxNxH, k_BxLxKxH, v_BxLxKxH, seg_BxL)
