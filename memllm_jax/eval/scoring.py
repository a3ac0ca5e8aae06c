"""Batched model calls used by the evaluations: next-token log-probs of whole sequences, and greedy
generation until a stop token (memory-read queries, QA answers).

Both split the nnx model into graphdef/state once and jit a pure function of the state, padding batch and
length to buckets so that a handful of shapes are compiled per run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memllm_jax.decode.graph import cache_factory, host, layered, merge, split_model
from memllm_jax.decode.loop import run_steps
from memllm_jax.decode.prefill import prefill
from memllm_jax.decode.sampling import argmax
from memllm_jax.decode.shapes import doubled, round_up
from memllm_jax.model.decoder import init_cache

def batches_by_length(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of `lengths` in batches of at most `batch_size`, shortest first, so that each batch is padded to
    about its own rows' length. A memory read's continuation runs from a few tokens to the whole rest of its
    document: taken in document order, batches of 8 of Table 2's gold-position reads were padded to 2.1x their
    tokens, and by length to 1.3x (SmolLM2-135M, 50 Re-DocRED documents: the continuations' forwards ~90 s ->
    ~60 s). Ties keep the input order (a stable sort); each caller puts results back in the input's order."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]


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
    """The keys / values a sequence left in the cache (on the host, in the cache's layout: `KVCache`, T tokens), so
    a continuation of any of its prefixes is scored without encoding that prefix again."""

    k_LxKxHxT: np.ndarray
    v_LxKxTxH: np.ndarray


@dataclasses.dataclass
class ModelWork:
    """The real tokens a `Scorer` or `GreedyGenerator` ran through the model (batch and length padding not counted),
    counted on the host from the inputs, for the run's roofline table."""

    positions: int = 0
    """Tokens forwarded (prefilled or scored) or generated."""
    logits: int = 0
    """Positions whose next-token logits were taken."""
    attention_pairs: int = 0
    """(query, key) pairs attended: a token at cache position t attends to t + 1 keys."""
    decoded: int = 0
    """Of `positions`: tokens generated one step at a time."""

    def add(self, prefix: int, n: int, logits: bool = True) -> None:
        """`n` tokens forwarded after `prefix` cached ones."""
        self.positions += n
        self.logits += n if logits else min(n, 1)
        self.attention_pairs += n * prefix + n * (n + 1) // 2

    def generation(self, prompt: int, fed: int, generated: int) -> None:
        """A row of generation: its `prompt` prefilled (logits at its end), then `fed` tokens one at a time, of
        which `generated` were chosen by the model (the rest fed by the host, e.g. memory answers)."""
        self.add(0, prompt, logits=False)
        self.add(prompt, fed)
        self.decoded += generated

    def __iadd__(self, other: "ModelWork") -> "ModelWork":
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self


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
        self.work = ModelWork()
        self._kept: tuple[tuple, list[SeqScores]] | None = None
        """The last `score(..., keep_kv=True)`: (its sequences, its scores)."""

    @property
    def keeps_kv(self) -> bool:
        return self._score_cached is not None

    def _empty_cache(self, length: int):
        return init_cache(self.cfg, self.batch_size, length, jnp.dtype(self.cfg.compute_dtype))

    def score(self, seqs: Sequence[Sequence[int]], keep_kv: bool = False) -> list[SeqScores]:
        """Scores of each sequence; with `keep_kv` (models that keep no cache of their own) each result also
        carries `.kv`, its PrefixKV. The last such call's results are kept and returned again for the same sequences
        (Table 2's rows score the same documents' plain forward with one model; it is run, and counted in `work`,
        once)."""
        if keep_kv and self.keeps_kv:
            key = tuple(map(tuple, seqs))
            if self._kept is None or self._kept[0] != key:
                self._kept = None  # the old keys / values go before the new ones are made
                self._kept = (key, self._score_keeping_kv(seqs))
            return self._kept[1]
        out: list[SeqScores | None] = [None] * len(seqs)
        for batch in batches_by_length([len(s) for s in seqs], self.batch_size):
            chunk = [list(seqs[i]) for i in batch]
            longest = max(len(s) for s in chunk)
            if longest > self.max_len:
                raise ValueError(f"sequence of {longest} tokens exceeds the model's max_seq_len {self.max_len}")
            L = min(round_up(longest), max(self.max_len, longest))
            lp, lmr, am = jax.device_get(self._score(self.state, *self._pad(chunk, L)))
            for seq in chunk:
                self.work.add(0, len(seq))
            for b, (i, s) in enumerate(zip(batch, chunk)):
                n = len(s) - 1
                out[i] = SeqScores(lp[b, :n].astype(np.float64), lmr[b, :n].astype(np.float64), am[b, :n])
        return out  # type: ignore[return-value]


    def _score_keeping_kv(self, seqs: Sequence[Sequence[int]]) -> list[SeqScores]:
        out: list[SeqScores | None] = [None] * len(seqs)
        for batch in batches_by_length([len(s) for s in seqs], self.batch_size):
            chunk = [list(seqs[i]) for i in batch]
            L = round_up(max(len(s) for s in chunk))
            tokens, mask = self._pad(chunk, L)
            lp, lmr, am, cache = self._score_cached(self.state, tokens, mask, self._empty_cache(L))
            lp, lmr, am, k, v = jax.device_get((lp, lmr, am, cache.k_LxBxKxHxS, cache.v_LxBxKxSxH))
            for seq in chunk:
                self.work.add(0, len(seq))
            for b, (i, s) in enumerate(zip(batch, chunk)):
                n = len(s) - 1
                out[i] = SeqScores(lp[b, :n].astype(np.float64), lmr[b, :n].astype(np.float64), am[b, :n],
                                   kv=PrefixKV(np.ascontiguousarray(k[:, b, ..., :len(s)]),
                                               np.ascontiguousarray(v[:, b, :, :len(s)])))
        return out  # type: ignore[return-value]

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
        out: list[SeqScores | None] = [None] * len(items)
        for batch in batches_by_length([len(c) for _, _, c in items], self.batch_size):
            chunk = [items[i] for i in batch]
            S = round_up(max(P + len(c) for _, P, c in chunk))
            Lc = round_up(max(len(c) for _, _, c in chunk), 16)
            for prefix, P, _ in chunk:
                if not 0 < P <= len(prefix.lp_mr):
                    raise ValueError(f"continuation after {P} tokens of a kept sequence of {len(prefix.lp_mr) + 1}: "
                                     "the kept scores must reach past the prefix")
            cache_shape = jax.eval_shape(lambda: self._empty_cache(S))
            cache = _with_prefixes(cache_shape, [prefix.kv for prefix, _, _ in chunk], [P for _, P, _ in chunk])
            tokens, mask = self._pad([list(c) for _, _, c in chunk], Lc)
            lp, lmr, am, _ = jax.device_get(self._score_cached(self.state, tokens, mask, cache))
            for _, P, c in chunk:
                self.work.add(P, len(c))
            for b, (i, (prefix, P, c)) in enumerate(zip(batch, chunk)):
                n = len(c)
                out[i] = SeqScores(
                    np.concatenate([prefix.lp_next[:P - 1], prefix.lp_mr[P - 1:P], lp[b, :n - 1].astype(np.float64)]),
                    np.concatenate([prefix.lp_mr[:P], lmr[b, :n - 1].astype(np.float64)]),
                    np.concatenate([prefix.argmax[:P], am[b, :n - 1]]))
        return out  # type: ignore[return-value]


class GreedyGenerator:
    """Batched greedy decoding with a KV cache until one of `stop_ids` (kept) or `max_new` tokens: the prompt
    prefilled as the decoding loop does (`decode.prefill.prefill`), then every new token of a batch in one call of
    the decoding loop (`decode.loop.run_steps`, no host round trip per token), on caches of a few power-of-two
    lengths (few compiled shapes).

    Its step is its own, not the read chunk's: the read chunk's compiled program (the same arithmetic per row)
    rounds differently enough to flip a near-tie, 1 of Table 2 row 5's 272 queries on an AMX Xeon (bf16 operands),
    which moved rows 5 and 6 in the third digit."""

    def __init__(self, model: nnx.Module, batch_size: int = 8, pad_id: int = 0):
        self.graphdef, self.params = split_model(model)
        self.cfg = getattr(model, "cfg", None)
        self._own_cache = hasattr(model, "make_cache")  # scripted test models keep their context themselves
        self._make_cache = cache_factory(model)
        self.vocab = int(self.cfg.vocab_size) if self.cfg is not None else int(model.vocab_size)
        self.batch_size, self.pad_id = int(batch_size), int(pad_id)
        self.work = ModelWork()

    def generate(self, prefixes: Sequence[Sequence[int]], stop_ids: Sequence[int], max_new: int,
                 kept: Sequence[tuple[PrefixKV, int]] | None = None) -> list[list[int]]:
        """New tokens per prefix, ending with the stop token when one was produced. With `kept[i] = (kv, P)`,
        the first P tokens of prefix i are taken from kept keys / values (`Scorer.score(..., keep_kv=True)`)
        and only the rest is encoded (models without their own cache only)."""
        stops_S = jnp.asarray(sorted(set(int(s) for s in stop_ids)), jnp.int32)
        B = self.batch_size
        out: list[list[int]] = [[] for _ in prefixes]
        if self._own_cache:
            kept = None
        for batch in batches_by_length([len(p) for p in prefixes], B):
            chunk = [list(prefixes[i]) for i in batch]
            done_P = [0] * len(chunk) if kept is None else [kept[i][1] for i in batch]
            longest = max(len(p) for p in chunk)
            need = longest + max_new
            cache_len = doubled(need, 128)
            if self.cfg is not None:
                cache_len = min(cache_len, max(int(self.cfg.max_seq_len), need))
            cache = self._make_cache(B, cache_len)
            if kept is not None:
                cache = _with_prefixes(cache, [kept[i][0] for i in batch], done_P)
            # unused rows hold one pad token so their lengths stay valid; they count as done from the start
            rows = [p[P:] for p, P in zip(chunk, done_P)] + [[self.pad_id]] * (B - len(chunk))
            cache, logits_BxV = prefill(self.graphdef, self.params, cache, np.zeros((B, self.vocab), np.float32),
                                        rows, self.pad_id, donate=True)
            idle_B = np.arange(B) >= len(chunk)
            new_BxN = host(_greedy(self.graphdef, self.params, cache, logits_BxV, stops_S, idle_B, max_new=int(max_new)))
            for b, i in enumerate(batch):
                out[i] = [int(t) for t in new_BxN[b] if t >= 0]
                self.work.add(done_P[b], len(chunk[b]) - done_P[b], logits=False)
                n = len(out[i])  # each generated token is fed (the first comes from the prefill's logits)
                self.work.add(len(chunk[b]), n)
                self.work.decoded += n
        return out


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new"))
def _greedy(graphdef, params, cache, logits_BxV, stops_S, idle_B, max_new: int):
    """Greedy tokens after the prefilled `cache` / `logits_BxV`: row b's new tokens in `[b, :n]`, -1 after; a
    row stops after a token in `stops_S` (kept), the loop once every row stopped or after `max_new` tokens."""
    model = merge(graphdef, params)
    B = logits_BxV.shape[0]

    def step(s):
        next_B, done_B, new_BxN, cache, i = s
        new_BxN = new_BxN.at[:, i].set(jnp.where(done_B, -1, next_B))
        done_B = done_B | jnp.isin(next_B, stops_S)
        logits_Bx1xV, cache = model(next_B[:, None], cache.lengths_B[:, None], cache=cache)
        return argmax(logits_Bx1xV[:, 0]), done_B, new_BxN, cache, i + 1

    s = (argmax(logits_BxV), jnp.asarray(idle_B), jnp.full((B, max_new), -1, jnp.int32), layered(cache, model),
         jnp.int32(0))
    s, _ = run_steps(step, lambda i, s: (i < max_new) & ~jnp.all(s[1]), s)
    return s[2]


def _with_prefixes(cache, kvs: Sequence[PrefixKV], lengths: Sequence[int]):
    """An empty cache shaped like `cache` (an empty cache or its `jax.eval_shape`; built on the host, no device
    copy) holding the first lengths[b] kept keys / values of kvs[b] in row b."""
    k = np.zeros(cache.k_LxBxKxHxS.shape, cache.k_LxBxKxHxS.dtype)
    v = np.zeros(cache.v_LxBxKxSxH.shape, cache.v_LxBxKxSxH.dtype)
    lengths_B = np.zeros(k.shape[1], np.int32)
    for b, (kv, P) in enumerate(zip(kvs, lengths)):
        k[:, b, ..., :P] = kv.k_LxKxHxT[..., :P]
        v[:, b, :, :P] = kv.v_LxKxTxH[:, :, :P]
        lengths_B[b] = P
    return type(cache)(jnp.asarray(k), jnp.asarray(v), jnp.asarray(lengths_B))
