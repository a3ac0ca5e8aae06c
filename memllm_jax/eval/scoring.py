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
    kv: "PrefixKV | None" = None
    """The sequence's keys / values when scored with `keep_kv` (else None)."""


@dataclasses.dataclass
class PrefixKV:
    """The keys / values a sequence left in the cache (layers x tokens x kv heads x head dim, on the host), so a
    continuation of any of its prefixes is scored without encoding that prefix again."""

    k_LxTxKxH: np.ndarray
    v_LxTxKxH: np.ndarray


class Scorer:
    """Teacher-forced scoring of token sequences with one model (base or base + adapter).

    `score(seqs, keep_kv=True)` also keeps each sequence's keys / values; `score_continuations` then scores
    tokens that follow the first P tokens of such a sequence, attending to its kept keys / values: a memory read
    at token P costs the read call, its result and the text after it, not the whole document again. Models
    that keep their own context in a cache (`make_cache`, the scripted test models) have no keys / values to
    keep: their continuations are scored as whole sequences."""

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

        def score_cached(state, tokens_BxL, mask_BxL, cache):
            m = nnx.merge(graphdef, state)
            positions_BxL = cache.lengths_B[:, None] + jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32)[None]
            logits_BxLxV, cache = m(tokens_BxL, positions_BxL, attn_mask_BxL=mask_BxL, cache=cache)
            logp_BxLxV = jax.nn.log_softmax(logits_BxLxV, axis=-1)
            lp_next_BxL = jnp.take_along_axis(logp_BxLxV[:, :-1], tokens_BxL[:, 1:, None], axis=-1)[..., 0]
            return lp_next_BxL, logp_BxLxV[..., mr_id], jnp.argmax(logits_BxLxV, axis=-1), cache

        self._score_cached = None if make_cache is not None else jax.jit(score_cached)
        self.cfg = cfg

    @property
    def keeps_kv(self) -> bool:
        return self._score_cached is not None

    def _empty_cache(self, length: int):
        return init_cache(self.cfg, self.batch_size, length, jnp.dtype(self.cfg.compute_dtype))

    def score(self, seqs: Sequence[Sequence[int]], keep_kv: bool = False) -> list[SeqScores]:
        """Scores of each sequence; with `keep_kv` (models that keep no cache of their own) each result also
        carries `.kv`, its PrefixKV."""
        if keep_kv and self.keeps_kv:
            return self._score_keeping_kv(seqs)
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


    def _score_keeping_kv(self, seqs: Sequence[Sequence[int]]) -> list[SeqScores]:
        out: list[SeqScores] = []
        for start in range(0, len(seqs), self.batch_size):
            chunk = [list(s) for s in seqs[start:start + self.batch_size]]
            L = _bucket(max(len(s) for s in chunk))
            tokens, mask = self._pad(chunk, L)
            lp, lmr, am, cache = self._score_cached(self.state, tokens, mask, self._empty_cache(L))
            lp, lmr, am, k, v = jax.device_get((lp, lmr, am, cache.k_LxBxSxKxH, cache.v_LxBxSxKxH))
            for b, s in enumerate(chunk):
                n = len(s) - 1
                scores = SeqScores(lp[b, :n].astype(np.float64), lmr[b, :n].astype(np.float64), am[b, :n])
                scores.kv = PrefixKV(np.ascontiguousarray(k[:, b, :len(s)]), np.ascontiguousarray(v[:, b, :len(s)]))
                out.append(scores)
        return out

    def _pad(self, chunk: list[list[int]], L: int):
        tokens = np.full((self.batch_size, L), self.pad_id, np.int32)
        mask = np.zeros((self.batch_size, L), bool)
        for b, s in enumerate(chunk):
            tokens[b, :len(s)] = s
            mask[b, :len(s)] = True
        return jnp.asarray(tokens), jnp.asarray(mask)

    def score_continuations(self, items: Sequence[tuple[SeqScores, int, Sequence[int]]]) -> list[SeqScores]:
        """For each (scores of a sequence s kept with `keep_kv`, P, continuation c): the scores of s[:P] + c,
        computed from the kept keys / values of s[:P] and a forward over c only. c[0] must be the read marker
        (its log-prob is the kept p(MR | s[:P]))."""
        if not self.keeps_kv:
            raise ValueError("this model keeps no keys / values: score whole sequences instead")
        out: list[SeqScores] = []
        for start in range(0, len(items), self.batch_size):
            chunk = items[start:start + self.batch_size]
            S = _bucket(max(P + len(c) for _, P, c in chunk))
            Lc = _bucket(max(len(c) for _, _, c in chunk), 16)
            first = chunk[0][0].kv.k_LxTxKxH
            k = np.zeros((first.shape[0], self.batch_size, S, *first.shape[2:]), first.dtype)
            v = np.zeros_like(k)
            lengths = np.zeros(self.batch_size, np.int32)
            for b, (prefix, P, _) in enumerate(chunk):
                if not 0 < P <= len(prefix.lp_mr):
                    raise ValueError(f"continuation after {P} tokens of a kept sequence of {len(prefix.lp_mr) + 1}: "
                                     "the kept scores must reach past the prefix")
                k[:, b, :P] = prefix.kv.k_LxTxKxH[:, :P]
                v[:, b, :P] = prefix.kv.v_LxTxKxH[:, :P]
                lengths[b] = P
            cache = type(self._empty_cache(1))(jnp.asarray(k), jnp.asarray(v), jnp.asarray(lengths))
            tokens, mask = self._pad([list(c) for _, _, c in chunk], Lc)
            lp, lmr, am, _ = jax.device_get(self._score_cached(self.state, tokens, mask, cache))
            for b, (prefix, P, c) in enumerate(chunk):
                n = len(c)
                out.append(SeqScores(
                    np.concatenate([prefix.lp_next[:P - 1], prefix.lp_mr[P - 1:P], lp[b, :n - 1].astype(np.float64)]),
                    np.concatenate([prefix.lp_mr[:P], lmr[b, :n - 1].astype(np.float64)]),
                    np.concatenate([prefix.argmax[:P], am[b, :n - 1]])))
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
            positions_BxL = cache.lengths_B[:, None] + jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32)[None]
            logits_BxLxV, cache = m(tokens_BxL, positions_BxL, attn_mask_BxL=mask_BxL, cache=cache)
            last_B = mask_BxL.sum(-1) - 1
            return jnp.argmax(logits_BxLxV[jnp.arange(tokens_BxL.shape[0]), last_B], -1), cache

        def step(state, tok_B, cache):
            m = nnx.merge(graphdef, state)
            logits_Bx1xV, cache = m(tok_B[:, None], cache.lengths_B[:, None], cache=cache)
            return jnp.argmax(logits_Bx1xV[:, 0], -1), cache

        self._prefill = jax.jit(prefill)
        self._step = jax.jit(step)

    def generate(self, prefixes: Sequence[Sequence[int]], stop_ids: Sequence[int], max_new: int,
                 kept: Sequence[tuple[PrefixKV, int]] | None = None) -> list[list[int]]:
        """New tokens per prefix, ending with the stop token when one was produced. With `kept[i] = (kv, P)`,
        the first P tokens of prefix i are taken from kept keys / values (`Scorer.score(..., keep_kv=True)`)
        and only the rest is encoded (models without their own cache only)."""
        stops = np.asarray(sorted(set(int(s) for s in stop_ids)), np.int64)
        out: list[list[int]] = []
        if self._make_cache is not None:
            kept = None
        for start in range(0, len(prefixes), self.batch_size):
            chunk = [list(p) for p in prefixes[start:start + self.batch_size]]
            done_P = [0] * len(chunk) if kept is None else [P for _, P in kept[start:start + self.batch_size]]
            longest = max(len(p) for p in chunk)
            if kept is not None:
                chunk = [p[P:] for p, P in zip(chunk, done_P)]
            L = _bucket(max(len(p) for p in chunk), 16 if kept is not None else 64)
            max_seq = self.cfg.max_seq_len if self.cfg is not None else L + max_new
            need = (L if kept is None else longest) + max_new
            cache_len = min(_bucket(need), max(max_seq, need))
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
            if kept is not None:
                cache = _with_prefixes(cache, [kv for kv, _ in kept[start:start + self.batch_size]], done_P)
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


def _with_prefixes(cache, kvs: Sequence[PrefixKV], lengths: Sequence[int]):
    """`cache` (empty) holding the first lengths[b] kept keys / values of kvs[b] in row b."""
    k, v = np.array(cache.k_LxBxSxKxH), np.array(cache.v_LxBxSxKxH)
    lengths_B = np.zeros(k.shape[1], np.int32)
    for b, (kv, P) in enumerate(zip(kvs, lengths)):
        k[:, b, :P] = kv.k_LxTxKxH[:, :P]
        v[:, b, :P] = kv.v_LxTxKxH[:, :P]
        lengths_B[b] = P
    return type(cache)(jnp.asarray(k), jnp.asarray(v), jnp.asarray(lengths_B))
