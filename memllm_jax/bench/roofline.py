"""FLOP counts of a decoder forward and of a memory-write run, for the benches' "of ceiling" / "of roofline" columns.

Counted from the model's shapes (ModelConfig: D = d_model, N heads, K kv heads, H = head_dim, F = d_ff,
V = vocab, n_layers). Per token and layer the matmuls q, k, v, o, gate, up, down cost 2 x P FLOPs with
P = D(NH + 2KH) + NH.D + 3DF; the LM head costs 2DV per position whose logits are computed; attention (QK^T and
PV) costs 2 x 2 x NH per (query, key) pair and layer. The embedding lookup, norms, RoPE, softmax and SiLU are
not counted (elementwise: 3-4% of XLA's own count on the 2-layer D=64 model of the tests, less on wider ones).

A write run (`decode.writer.decode_writes` / `write_corpus`) prefills each prompt (ending with `({MEM_WRITE-->`)
and decodes its call; per prompt i: p_i prompt tokens, g_i generated tokens fed back (`n_generated`).

Useful FLOPs, the work the task needs whatever the batching (the roofline's numerator):
  prefill: one forward per distinct prompt prefix, i.e. per node of the prompts' prefix trie (a token whose
      whole prefix two prompts share has the same keys / values in both), n_layers x 2P each; the token at
      position t attends to t + 1 keys; the LM head at each prompt's last token only (the first generated
      token's logits);
  decode: per fed token j < g_i: n_layers x 2P + 2DV, and attention over the p_i + j + 1 keys then cached.
  useful = sum_trie-nodes(n_layers (2P + 4NH (t+1))) + 2DV x #prompts
           + sum_i sum_{j<g_i} (n_layers (2P + 4NH (p_i + j + 1)) + 2DV)
Roofline seconds = useful / ceiling (`bench.ceiling`); "of roofline" = (useful / measured seconds) / ceiling.

Executed FLOPs, what the write path computes (it pads, so executed >= useful):
  a prefill call of B rows x W tokens (W bucketed, `decode.shapes.bucket`; padding rows and tokens included)
      attending A cache slots: B W n_layers 2P + B 2DV + n_layers 4NH B W A (logits at each row's last token);
      `decode.prefill.prefill` makes one such call, or one per group of rows of similar length (`prefill_calls`);
      `decode.prefill.prefill_shared` is two such calls (trunk rows, then every row's rest);
  a decode step runs all B rows (batch padding and finished rows too) over the whole cache of S slots:
      B (n_layers (2P + 4NH S) + 2DV); the loop runs max_i(g_i + [row i stopped at a cut]) steps.
  refilled (`decode.refill`): a pool of B rows over the whole stream (S fits its longest prompt); row i runs
      g_i + [stopped at a cut] steps; before each loop call the host prefills the new prompts in batches of
      power-of-two rows (`refill.fill_sizes`, shared prefixes as above) and the call runs until enough rows
      stopped (`refill_schedule`), every step over all B rows.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


# ------------------------------------------------------------------------------------------- a forward


def matmul_shapes(cfg) -> dict[str, tuple[int, int]]:
    """(inputs, outputs) of each matmul of one layer."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff
    return {"q": (D, N * H), "k": (D, K * H), "v": (D, K * H), "o": (N * H, D), "gate": (D, F), "up": (D, F),
            "down": (F, D)}


def layer_params(cfg) -> int:
    """P: matmul parameters of one layer."""
    return sum(a * b for a, b in matmul_shapes(cfg).values())


def body_flops(cfg) -> float:
    """Matmul FLOPs of one token through every layer (attention scores excluded)."""
    return 2.0 * cfg.n_layers * layer_params(cfg)


def head_flops(cfg) -> float:
    """FLOPs of one position's logits."""
    return 2.0 * cfg.d_model * cfg.vocab_size


def attention_flops(cfg, pairs: float) -> float:
    """QK^T and PV over `pairs` (query, key) pairs, in every layer."""
    return 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * pairs


def forward_flops(cfg, batch: int, length: int) -> float:
    """Matmul FLOPs of one cache-free forward pass with logits at every position (attention counted over the full
    length x length block it computes)."""
    return batch * length * (body_flops(cfg) + head_flops(cfg)) + attention_flops(cfg, batch * length * length)


# ------------------------------------------------------------------------------------------- useful work


def trie_positions(prompts: Sequence[Sequence[int]]) -> list[int]:
    """Positions of the nodes of the prompts' prefix trie (each distinct prefix once, at its last token's
    position): in lexicographic order, a prompt shares the most with its predecessor."""
    from memllm_jax.tokenizer import common_prefix

    ordered = sorted(tuple(p) for p in prompts)
    positions: list[int] = []
    for prev, cur in zip([()] + ordered, ordered):
        positions += range(common_prefix(prev, cur), len(cur))
    return positions


@dataclasses.dataclass(frozen=True)
class WriteFlops:
    prefill: float
    decode: float

    @property
    def total(self) -> float:
        return self.prefill + self.decode

    def __add__(self, other: "WriteFlops") -> "WriteFlops":
        return WriteFlops(self.prefill + other.prefill, self.decode + other.decode)


def useful_write_flops(cfg, prompts: Sequence[Sequence[int]], generated: Sequence[int]) -> WriteFlops:
    """The useful FLOPs of writing `prompts` with `generated[i]` tokens fed back after prompt i (module docstring)."""
    positions = np.asarray(trie_positions(prompts), np.float64)
    prefill = len(positions) * body_flops(cfg) + attention_flops(cfg, float((positions + 1).sum()))
    prefill += len(prompts) * head_flops(cfg)
    g = np.asarray(generated, np.float64)
    p = np.asarray([len(x) for x in prompts], np.float64)
    pairs = float((g * p + g * (g + 1) / 2).sum())  # the j-th fed token attends to p + j + 1 keys
    decode = g.sum() * (body_flops(cfg) + head_flops(cfg)) + attention_flops(cfg, pairs)
    return WriteFlops(prefill, decode)


# ------------------------------------------------------------------------------------------- executed work


def prefill_call_flops(cfg, rows: int, width: int, slots: int) -> float:
    """One `decode.prefill.prefill` call: `rows` x `width` tokens (padding included), logits at each row's last
    token, each query against `slots` cache slots."""
    return rows * (width * body_flops(cfg) + head_flops(cfg)) + attention_flops(cfg, rows * width * slots)


def decode_step_flops(cfg, rows: int, slots: int) -> float:
    """One write-loop step: every row feeds one token and attends to all `slots` slots of the cache."""
    return rows * (body_flops(cfg) + head_flops(cfg)) + attention_flops(cfg, rows * slots)


def _prefill_flops(cfg, lengths: np.ndarray, new: Sequence[int], max_len: int) -> float:
    """`decode.prefill.prefill` of `new[b]` tokens after `lengths[b]` cached ones: its pieces, and each piece's calls
    (`prefill_calls`: rows, bucketed widths, attended slots)."""
    from memllm_jax.decode.prefill import MAX_PREFILL, prefill_calls

    new = np.asarray(new, np.int64)
    lengths = np.asarray(lengths, np.int64)
    if new.max(initial=0) > MAX_PREFILL:
        total = 0.0
        for start in range(0, int(new.max()), MAX_PREFILL):
            piece = np.clip(new - start, 0, MAX_PREFILL)
            total += _prefill_flops(cfg, lengths, piece, max_len)
            lengths = lengths + piece
        return total
    return sum(prefill_call_flops(cfg, len(new) if c.rows is None else len(c.rows), c.width,
                                  max_len if c.attend is None else c.attend)
               for c in prefill_calls(lengths, new, max_len))


def _shared_prefill_flops(cfg, rows: Sequence[Sequence[int]], n_active: int, max_len: int) -> float:
    """`decode.prefill.prefill_shared`: the trunks' prefill, then each row's rest after its grafted prefix."""
    from memllm_jax.decode.prefill import MIN_SAVED, plan_sharing

    B = len(rows)
    plan = plan_sharing(rows, n_active)
    active = [len(r) if b < n_active else 0 for b, r in enumerate(rows)]
    if plan.saved < MIN_SAVED:
        return _prefill_flops(cfg, np.zeros(B, np.int64), active, max_len)
    T = 1 << max(0, (len(plan.trunks) - 1).bit_length())
    trunk_lengths = [len(rows[t]) for t in plan.trunks] + [0] * (T - len(plan.trunks))
    trunks = _prefill_flops(cfg, np.zeros(T, np.int64), trunk_lengths, max_len)
    shared = np.asarray(plan.shared, np.int64)
    rest = [0 if b >= n_active or b in plan.trunks else len(rows[b]) - shared[b] for b in range(B)]
    return trunks + _prefill_flops(cfg, shared, rest, max_len)


def executed_write_flops(cfg, prompts: Sequence[Sequence[int]], generated: Sequence[int], stopped: Sequence[bool], *,
                         max_new_tokens: int, pad_to: int | None = None, share_prefixes: bool = True) -> WriteFlops:
    """FLOPs one `decode_writes(prompts, max_new_tokens=..., pad_to=..., share_prefixes=...)` call executes, given
    each prompt's fed tokens and whether it stopped at a cut (module docstring)."""
    B = len(prompts)
    if B == 0:
        return WriteFlops(0.0, 0.0)
    rows = [list(p) for p in prompts] + [[0]] * max(0, (pad_to or B) - B)  # padding rows: [BOS], not prefilled
    max_len = -(-(max(len(r) for r in rows) + max_new_tokens + 1) // 64) * 64
    if share_prefixes:
        prefill = _shared_prefill_flops(cfg, rows, B, max_len)
    else:
        prefill = _prefill_flops(cfg, np.zeros(len(rows), np.int64), [len(p) for p in prompts] + [0] * (len(rows) - B),
                                 max_len)
    steps = max(int(g) + bool(s) for g, s in zip(generated, stopped))
    return WriteFlops(prefill, steps * decode_step_flops(cfg, len(rows), max_len))


def executed_corpus_flops(cfg, prompts: Sequence[Sequence[int]], generated: Sequence[int], stopped: Sequence[bool], *,
                          batch_size: int, max_new_tokens: int, share_prefixes: bool = True) -> WriteFlops:
    """`write_corpus(batch_size=...)`: consecutive batches of `batch_size` prompts, each padded to it."""
    total = WriteFlops(0.0, 0.0)
    for s in range(0, len(prompts), batch_size):
        part = slice(s, s + batch_size)
        total += executed_write_flops(cfg, prompts[part], generated[part], stopped[part], max_new_tokens=max_new_tokens,
                                      pad_to=batch_size, share_prefixes=share_prefixes)
    return total


def refill_schedule(steps: Sequence[int], pool: int, refill_at: int) -> list[tuple[list[int], int]]:
    """The loop calls of `decode.refill.iter_refill_writes` for prompts that run `steps[i]` steps each: per call,
    the prompts filled before it and the steps it runs (what its `trace` records)."""
    from memllm_jax.decode.refill import exit_at

    held, left, pending, calls = [-1] * pool, [0] * pool, 0, []
    while True:
        free = [b for b in range(pool) if held[b] < 0]
        new = list(range(pending, min(len(steps), pending + len(free))))
        for b, i in zip(free, new):
            held[b], left[b] = i, int(steps[i])
        pending += len(new)
        running = [b for b in range(pool) if held[b] >= 0]
        if not running:
            return calls
        must_stop = exit_at(pool, len(running), len(steps) - pending, refill_at) - (pool - len(running))
        run = sorted(left[b] for b in running)[min(must_stop, len(running)) - 1]
        calls.append((new, run))
        for b in running:
            left[b] -= run
            if left[b] <= 0:
                held[b] = -1


def executed_refill_flops(cfg, prompts: Sequence[Sequence[int]], generated: Sequence[int], stopped: Sequence[bool], *,
                          pool: int, max_new_tokens: int, refill_at: int | None = None,
                          share_prefixes: bool = True) -> WriteFlops:
    """FLOPs `decode.refill.refill_writes(prompts, pool=..., refill_at=...)` executes (module docstring)."""
    from memllm_jax.decode.refill import default_refill_at, fill_sizes
    from memllm_jax.decode.shapes import cache_slots

    if not prompts:
        return WriteFlops(0.0, 0.0)
    refill_at = default_refill_at(pool) if refill_at is None else refill_at
    max_len = cache_slots(max(len(p) for p in prompts), max_new_tokens)
    steps = [int(g) + bool(s) for g, s in zip(generated, stopped)]
    prefill = decode = 0.0
    for new, run in refill_schedule(steps, pool, refill_at):
        start = 0
        for K in fill_sizes(len(new)):
            rows = [list(prompts[i]) for i in new[start:start + K]]
            start += K
            if share_prefixes:
                prefill += _shared_prefill_flops(cfg, rows, K, max_len)
            else:
                prefill += _prefill_flops(cfg, np.zeros(K, np.int64), [len(r) for r in rows], max_len)
        decode += run * decode_step_flops(cfg, pool, max_len)
    return WriteFlops(prefill, decode)
