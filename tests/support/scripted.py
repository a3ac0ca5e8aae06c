"""Stand-ins with the model and tokenizer interfaces, for exercising the controllers exactly.

`PolicyModel` is a "model" whose next-token logits are a ranked preference list computed by a Python
function of the whole context (via `jax.pure_callback`), so a test can script exactly what is generated at
every point, including after prefilled answers and rewinds. `TableModel` has logits `table[position,
token]` (random logits that still depend on the chosen tokens). `CharTokenizer` (the decode bench's)
maps markers to single special ids and every other character to its own id.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, struct

from memllm_jax.bench.decode import CharTokenizer  # noqa: F401  (tests import it from here)


@struct.dataclass
class TokenCache:
    """A cache that keeps the tokens themselves; `lengths_B` as in the model's KV cache."""

    tokens_BxS: jax.Array
    lengths_B: jax.Array

    @property
    def max_len(self) -> int:
        return self.tokens_BxS.shape[1]


def _append(cache: TokenCache, tokens_BxL, attn_mask_BxL) -> tuple[TokenCache, jax.Array]:
    B, L = tokens_BxL.shape
    S = cache.max_len
    write_BxL = jnp.where(attn_mask_BxL, cache.lengths_B[:, None] + jnp.arange(L)[None, :], S)
    buf = cache.tokens_BxS.at[jnp.arange(B)[:, None], write_BxL].set(tokens_BxL, mode="drop")
    return TokenCache(buf, cache.lengths_B + attn_mask_BxL.sum(-1).astype(jnp.int32)), write_BxL


class PolicyModel(nnx.Module):
    """`policy(context: list[int]) -> list[int]` gives the next tokens in order of preference."""

    def __init__(self, policy: Callable[[list[int]], Sequence[int]], vocab_size: int):
        self.policy = policy
        self.vocab_size = vocab_size

    def make_cache(self, batch: int, max_len: int) -> TokenCache:
        return TokenCache(jnp.zeros((batch, max_len), jnp.int32), jnp.zeros((batch,), jnp.int32))

    def _logits(self, buf_BxS, write_BxL):
        buf, write = np.asarray(buf_BxS), np.asarray(write_BxL)
        B, L = write.shape
        out = np.full((B, L, self.vocab_size), -20.0, np.float32)
        for b in range(B):
            for i in range(L):
                if write[b, i] < buf.shape[1]:
                    for rank, t in enumerate(self.policy(buf[b, : write[b, i] + 1].tolist())):
                        out[b, i, t] = 10.0 - rank
        return out

    def __call__(self, tokens_BxL, positions_BxL, attn_mask_BxL=None, cache=None, deterministic=True):
        B, L = tokens_BxL.shape
        attn_mask_BxL = jnp.ones((B, L), bool) if attn_mask_BxL is None else attn_mask_BxL
        cache, write_BxL = _append(cache, tokens_BxL, attn_mask_BxL)
        shape = jax.ShapeDtypeStruct((B, L, self.vocab_size), jnp.float32)
        return jax.pure_callback(self._logits, shape, cache.tokens_BxS, write_BxL), cache


class TableModel(nnx.Module):
    """logits[b, i] = table[position, token] for a fixed random table."""

    def __init__(self, table_PxVxV: np.ndarray):
        self.table = nnx.Param(jnp.asarray(table_PxVxV, jnp.float32))

    def make_cache(self, batch: int, max_len: int) -> TokenCache:
        return TokenCache(jnp.zeros((batch, max_len), jnp.int32), jnp.zeros((batch,), jnp.int32))

    def __call__(self, tokens_BxL, positions_BxL, attn_mask_BxL=None, cache=None, deterministic=True):
        B, L = tokens_BxL.shape
        attn_mask_BxL = jnp.ones((B, L), bool) if attn_mask_BxL is None else attn_mask_BxL
        if cache is not None:
            cache, _ = _append(cache, tokens_BxL, attn_mask_BxL)
        P = self.table.shape[0]
        return self.table[...][jnp.minimum(positions_BxL, P - 1), tokens_BxL], cache
