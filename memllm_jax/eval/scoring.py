"""Batched model calls used by the evaluations: next-token log-probs of whole sequences, and greedy
generation until a stop token (memory-read queries, QA answers).

Both split the nnx model into graphdef/state once and jit a pure function of the state, padding batch and
length to buckets so that a handful of shapes are compiled per run.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memllm_jax.model.mistral import init_cache


def _bucket(n: int, quantum: int = 64) -> int:
    return max(quantum, -(-n // quantum) * quantum)


@dataclasses.dataclass
class SeqScores:
    """Per sequence of length L: `lp_next[k]` = log p(seq[k+1] | seq[:k+1]), `lp_mr[k]` = log p(MR | seq[:k+1]),
    `argmax[k]` = the most likely token after seq[:k+1]; all of length L - 1."""

    lp_next: np.ndarray
    lp_mr: np.ndarray
    argmax: np.ndarray


class Scorer:
    """Teacher-forced scoring of token sequences with one model (base or base + adapter)."""

    def __init__(self, model: nnx.Module, mr_id: int, batch_size: int = 8, pad_id: int = 0):
        self.graphdef, self.state = nnx.split(model)
        self.mr_id, self.batch_size, self.pad_id = int(mr_id), int(batch_size), int(pad_id)
        cfg = getattr(model, "cfg", None)
        self.max_len = int(cfg.max_seq_len) if cfg is not None else 1 << 16
        graphdef = self.graphdef
        make_cache = getattr(model, "make_cache", None)  # scripted test models keep their context in a cache

        def score(state, tokens_BxL, mask_BxL):
            m = nnx.merge(graphdef, state)
            positions_BxL = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)
            cache = make_cache(*tokens_BxL.shape) if make_cache is not None else None
            logits_BxLxV, _ = m(tokens_BxL, positions_BxL, attn_mask_BxL=mask_BxL, cache=cache)
            logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
            lp_next_BxL = jnp.take_along_axis(logp_BxLxV[:, :-1], tokens_BxL[:, 1:, None], axis=-1)[..., 0]
            return lp_next_BxL, logp_BxLxV[:, :-1, mr_id], jnp.argmax(logits_BxLxV[:, :-1], axis=-1)

        self._score = jax.jit(score)

    def score(self, seqs: Sequence[Sequence[int]]) -> list[SeqScores]:
        out: list[SeqScores] = []
        for start in range(0, len(seqs), self.batch_size):
            chunk = [list(s) for s in seqs[start:start + self.batch_size]]
            longest = max(len(s) for s in chunk)
            if longest > self.max_len:
                raise ValueError(f"sequence of {longest} tokens exceeds the model's max_seq_len {self.max_len}")
            L = min(_bucket(longest), max(self.max_len, longest))
            tokens = np.full((self.batch_size, L), self.pad_id, np.int32)
            mask = np.zeros((self.batch_size, L), bool)
            for b, s in enumerate(chunk):
                tokens[b, :len(s)] = s
                mask[b, :len(s)] = True
            lp, lmr, am = jax.device_get(self._score(self.state, jnp.asarray(tokens), jnp.asarray(mask)))
            for b, s in enumerate(chunk):
                n = len(s) - 1
                out.append(SeqScores(lp[b, :n].astype(np.float64), lmr[b, :n].astype(np.float64), am[b, :n]))
        return out


class GreedyGenerator:
    """Batched greedy decoding with a KV cache until one of `stop_ids` (kept) or `max_new` tokens."""

    def __init__(self, model: nnx.Module, batch_size: int = 8, pad_id: int = 0):
        self.graphdef, self.state = nnx.split(model)
        self.cfg = getattr(model, "cfg", None)
        self._make_cache = getattr(model, "make_cache", None)
        self.batch_size, self.pad_id = int(batch_size), int(pad_id)
        graphdef = self.graphdef

        def prefill(state, tokens_BxL, mask_BxL, cache):
            m = nnx.merge(graphdef, state)
            positions_BxL = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)
            logits_BxLxV, cache = m(tokens_BxL, positions_BxL, attn_mask_BxL=mask_BxL, cache=cache)
            last_B = mask_BxL.sum(-1) - 1
            return jnp.argmax(logits_BxLxV[jnp.arange(tokens_BxL.shape[0]), last_B], -1), cache

        def step(state, tok_B, cache):
            m = nnx.merge(graphdef, state)
            logits_Bx1xV, cache = m(tok_B[:, None], cache.lengths_B[:, None], cache=cache)
            return jnp.argmax(logits_Bx1xV[:, 0], -1), cache

        self._prefill = jax.jit(prefill)
        self._step = jax.jit(step)

    def generate(self, prefixes: Sequence[Sequence[int]], stop_ids: Sequence[int], max_new: int) -> list[list[int]]:
        """New tokens per prefix, ending with the stop token when one was produced."""
        stops = np.asarray(sorted(set(int(s) for s in stop_ids)), np.int64)
        out: list[list[int]] = []
        for start in range(0, len(prefixes), self.batch_size):
            chunk = [list(p) for p in prefixes[start:start + self.batch_size]]
            longest = max(len(p) for p in chunk)
            L = _bucket(longest)
            max_seq = self.cfg.max_seq_len if self.cfg is not None else L + max_new
            cache_len = min(_bucket(L + max_new), max(max_seq, L + max_new))
            if longest + max_new > cache_len:
                raise ValueError(f"prefix of {longest} tokens + {max_new} new exceeds the cache ({cache_len})")
            tokens = np.full((self.batch_size, L), self.pad_id, np.int32)
            mask = np.zeros((self.batch_size, L), bool)
            for b, p in enumerate(chunk):
                tokens[b, :len(p)] = p
                mask[b, :len(p)] = True
            mask[len(chunk):, 0] = True  # unused rows hold one pad token so their lengths stay valid
            if self._make_cache is not None:
                cache = self._make_cache(self.batch_size, cache_len)
            else:
                cache = init_cache(self.cfg, self.batch_size, cache_len, jnp.dtype(self.cfg.compute_dtype))
            nxt, cache = self._prefill(self.state, jnp.asarray(tokens), jnp.asarray(mask), cache)
            new = [[] for _ in chunk]
            done = np.zeros(len(chunk), bool)
            for _ in range(max_new):
                nxt_np = np.asarray(jax.device_get(nxt))
                for b in range(len(chunk)):
                    if not done[b]:
                        new[b].append(int(nxt_np[b]))
                        done[b] = bool(np.isin(nxt_np[b], stops))
                if done.all():
                    break
                nxt, cache = self._step(self.state, nxt, cache)
            out.extend(new)
        return out
