"""The training input pipeline: JSONL examples -> token ids + explicit loss mask -> global batches (grain).

Each record (docs/interfaces.md, "Data examples") is a list of text segments with loss flags. Every segment
is tokenized on its own, BOS is prepended and EOS appended when `eos` is true (EOS carries the loss flag of
the last segment). The per-token flag says "predict this token"; the batch field `loss_mask` is that flag
shifted to line up with `targets`. No sentinel target id is ever used.

Two ways to fill rows:
- "pad": one example per row, right-padded; rows are grouped by length (sort inside windows of shuffled
  examples) and padded to the smallest bucket length that fits, so the step compiles once per bucket.
  Over-long examples are truncated from the left (pretext), never into the loss span; examples whose
  loss span alone does not fit are dropped and counted.
- "pack": the examples of an epoch (shuffled) are concatenated into one stream cut into rows of
  `seq_len + 1` tokens (continuous positions, documents separated by BOS/EOS) - for pretraining.
- "pack_examples": whole examples share rows (first-fit, longest first, inside windows of shuffled
  examples); each keeps its own positions from 0 and `segment_ids` keep attention inside it, so a row
  computes exactly what one padded row per example would, with far less padding - for finetuning on
  short examples (memory-write / memory-read). One row length (`seq_len`), so one compilation.
- "pack_prefixes": "pack_examples" where examples that share a token prefix (one document's memory-write
  examples share their pretext, its memory-read examples the text before each read) are laid out as a
  trunk (the group's longest example, whole) and branches: each other example only from where it leaves the
  trunk, its positions continuing from there, attending to the trunk's tokens before that point and to its
  own (`prefix_segment_ids` / `prefix_lengths`). Every example sees exactly the keys it would see alone, so
  each loss term is the same, in 1.21x (write) to 1.57x (read) fewer batches per epoch on Re-DocRED. A group's
  examples share a row, so they train in the same step (groups, not examples, are shuffled).

The batch plan is a pure function of (seed, epoch, batch index), built by every process identically; the
global batch is laid out `[micro_batches, rows]` and each process materialises only its slice of the rows
(`jax.process_index()`), so the data a step sees does not depend on how many processes there are. Grain
serves the plan with prefetch threads, and its iterator state (the next batch index) is checkpointed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Iterator, Mapping, Protocol, Sequence

import numpy as np

import grain

from memllm_jax.errors import InputError, read_text
from memllm_jax.tokenizer import common_prefix


class Tokenizer(Protocol):
    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...


@dataclasses.dataclass(frozen=True)
class Example:
    ids: np.ndarray
    """int32 token ids, BOS first."""
    loss: np.ndarray
    """bool per token: True when the model is trained to predict this token."""
    where: str
    """file:line of the record (for error messages)."""


# ------------------------------------------------------------------------------------------- reading


def read_jsonl(path: str) -> list[tuple[str, dict]]:
    """`[(where, record)]`; bad input raises an InputError naming the file and line (byte offset if not UTF-8)."""
    out = []
    for lineno, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"{path}:{lineno}: invalid JSON: {exc.msg}: column {exc.colno}") from exc
        if not isinstance(record, dict):
            raise InputError(f"{path}:{lineno}: expected a JSON object, got {type(record).__name__}")
        out.append((f"{path}:{lineno}", record))
    return out


def _check_record(record: dict, where: str) -> list[dict]:
    segments = record.get("segments")
    if not isinstance(segments, list) or not segments:
        raise InputError(f"{where}: field 'segments' must be a non-empty list")
    for k, seg in enumerate(segments):
        if not isinstance(seg, dict) or not isinstance(seg.get("text"), str):
            raise InputError(f"{where}: segments[{k}].text must be a string")
        if not isinstance(seg.get("loss"), bool):
            raise InputError(f"{where}: segments[{k}].loss must be true or false")
    if not isinstance(record.get("eos", True), bool):
        raise InputError(f"{where}: field 'eos' must be true or false")
    return segments


def _assemble(segments: list[dict], pieces: Sequence[Sequence[int]], eos: bool, tok: Tokenizer, where: str) -> Example:
    ids: list[int] = [tok.bos_id]
    flags: list[bool] = [False]
    for seg, piece in zip(segments, pieces):
        ids += list(piece)
        flags += [seg["loss"]] * len(piece)
    if eos:
        ids.append(tok.eos_id)
        flags.append(bool(segments[-1]["loss"]))
    return Example(np.asarray(ids, np.int32), np.asarray(flags, bool), where)


def tokenize_records(records: Sequence[tuple[str, dict]], tok: Tokenizer) -> list[Example]:
    """Segments -> ids and per-token loss flags (BOS first; EOS last when `eos`) of many records, with one batched `encode_batch` call when the tokenizer has it."""
    segs = [_check_record(r, where) for where, r in records]
    texts = [s["text"] for ss in segs for s in ss]
    batch = getattr(tok, "encode_batch", None)
    encoded = batch(texts) if batch is not None and texts else [tok.encode(t) for t in texts]
    out, k = [], 0
    for (where, record), ss in zip(records, segs):
        out.append(_assemble(ss, encoded[k : k + len(ss)], record.get("eos", True), tok, where))
        k += len(ss)
    return out


def truncate_left(ex: Example, max_tokens: int) -> Example | None:
    """Keep BOS and the last `max_tokens - 1` tokens; None when that would cut into the first loss token."""
    n = len(ex.ids)
    if n <= max_tokens:
        return ex
    start = n - (max_tokens - 1)
    loss_pos = np.flatnonzero(ex.loss)
    if loss_pos.size and loss_pos[0] < start:
        return None
    ids = np.concatenate([ex.ids[:1], ex.ids[start:]])
    loss = np.concatenate([ex.loss[:1], ex.loss[start:]])
    return Example(ids, loss, ex.where)


def split_long(ex: Example, max_tokens: int) -> list[Example]:
    """Consecutive windows of at most `max_tokens` tokens overlapping by one, so every target token is
    predicted exactly once (held-out evaluation of a packed-stream run, whose documents may be long)."""
    if len(ex.ids) <= max_tokens:
        return [ex]
    step = max_tokens - 1
    out = []
    for start in range(0, len(ex.ids) - 1, step):
        ids, loss = ex.ids[start : start + max_tokens], ex.loss[start : start + max_tokens]
        if loss[1:].any():
            out.append(Example(ids, loss, ex.where))
    return out


@dataclasses.dataclass
class Corpus:
    examples: list[Example]
    dropped: int
    """Examples whose loss span did not fit into `seq_len + 1` tokens."""
    truncated: int
    """Examples shortened from the left."""

    @property
    def n_loss_tokens(self) -> int:
        return int(sum(e.loss.sum() for e in self.examples))


def load_corpus(paths: Sequence[str], tok: Tokenizer, seq_len: int, *, truncate: bool = True) -> Corpus:
    """Read and tokenize every record of the JSONL files (each process reads the small corpus whole)."""
    examples: list[Example] = []
    dropped = truncated = 0
    for path in paths:
        if not os.path.exists(path):
            raise InputError(f"{path}: training data file not found (TrainConfig.train_data)")
        for ex in tokenize_records(read_jsonl(path), tok):
            if truncate and len(ex.ids) > seq_len + 1:
                cut = truncate_left(ex, seq_len + 1)
                if cut is None:
                    dropped += 1
                    continue
                truncated += 1
                ex = cut
            if not ex.loss[1:].any():
                dropped += 1
                continue
            examples.append(ex)
    if not examples:
        raise InputError(f"{', '.join(map(str, paths))}: no usable training examples (dropped {dropped})")
    return Corpus(examples, dropped, truncated)


def split_heldout(corpus: Corpus, fraction: float, seed: int) -> tuple[Corpus, Corpus]:
    """A deterministic held-out split (for when no separate eval file is given)."""
    n = len(corpus.examples)
    n_eval = max(1, int(round(n * fraction)))
    if n_eval >= n:
        raise ValueError(f"eval_fraction={fraction} leaves no training examples out of {n}")
    order = np.random.default_rng([seed, 7]).permutation(n)
    ev = [corpus.examples[i] for i in sorted(order[:n_eval])]
    tr = [corpus.examples[i] for i in sorted(order[n_eval:])]
    return Corpus(tr, corpus.dropped, corpus.truncated), Corpus(ev, 0, 0)


# ---------------------------------------------------------------------------------------------- plans


def default_buckets(seq_len: int) -> tuple[int, ...]:
    """Powers of two from 32 up to `seq_len`, and `seq_len` itself."""
    out, b = [], 32
    while b < seq_len:
        out.append(b)
        b *= 2
    return tuple(out) + (seq_len,)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One global batch: `rows[i]` is a list of (example index, start, stop) pieces filling row i."""

    rows: tuple[tuple[tuple[int, int, int], ...], ...]
    length: int
    """Input length L of every row (targets have the same length)."""
    separate: bool = False
    """Each piece is an example with its own positions and segment ("pack_examples", "pack_prefixes")."""
    trunks: tuple[tuple[int, ...], ...] | None = None
    """"pack_prefixes": per row, per piece, the index of the piece it branches from (-1: none). A branch
    `(i, start, stop)` is example i from input position `start` on; its first `start` tokens are the trunk's."""


MIN_SHARED_PREFIX = 16
"""Fewest tokens an example must share with a trunk to be packed as its branch ("pack_prefixes")."""


@dataclasses.dataclass(frozen=True)
class PrefixGroup:
    members: tuple[tuple[int, int], ...]
    """(example index, start): the trunk first (start 0), then the branches, each laid out from input position
    `start` (the tokens before it are the trunk's)."""
    slots: int
    """Input slots the group takes in a row."""


def branch_start(ex: Example, trunk: Example) -> int:
    """Where `ex` can leave `trunk`: within their common prefix, before its first loss target (the branch computes
    every target it is trained on), and within the trunk's inputs."""
    first_target = int(np.flatnonzero(ex.loss[1:])[0]) + 1 if ex.loss[1:].any() else len(ex.ids) - 1
    return min(common_prefix(ex.ids, trunk.ids), first_target - 1, len(trunk.ids) - 1)


def prefix_groups(examples: Sequence[Example], seq_len: int, min_share: int = MIN_SHARED_PREFIX) -> list[PrefixGroup]:
    """The examples as groups of one trunk and its branches, each group within `seq_len` input slots. Examples
    sorted by their tokens fall into runs that share at least `min_share` tokens with the run's first; in each
    run the longest remaining example becomes a trunk and takes as branches the others that share `min_share`
    tokens with it while the group fits a row; what is left forms the next group. Deterministic."""
    order = sorted(range(len(examples)), key=lambda i: examples[i].ids.tolist())
    runs: list[list[int]] = []
    for i in order:
        if runs and common_prefix(examples[runs[-1][0]].ids, examples[i].ids) >= min_share:
            runs[-1].append(i)
        else:
            runs.append([i])
    groups = []
    for run in runs:
        remaining = sorted(run, key=lambda i: (-len(examples[i].ids), i))
        while remaining:
            trunk, rest = remaining[0], []
            members, slots = [(trunk, 0)], len(examples[trunk].ids) - 1
            for i in remaining[1:]:
                start = branch_start(examples[i], examples[trunk])
                cost = len(examples[i].ids) - 1 - start
                if start >= min_share and slots + cost <= seq_len:
                    members.append((i, start))
                    slots += cost
                else:
                    rest.append(i)
            groups.append(PrefixGroup(tuple(members), slots))
            remaining = rest
    return groups


PACKINGS = ("pad", "pack", "pack_examples", "pack_prefixes")
"""`TrainConfig.packing` values (module docstring)."""


class Planner:
    """Deterministic batch plans, a pure function of (seed, epoch, index within the epoch)."""

    def __init__(self, corpus: Corpus, *, seq_len: int, global_batch: int, packing: str, seed: int,
                 shuffle: bool = True, buckets: Sequence[int] = (), window: int = 32, drop_last: bool = True):
        if packing not in PACKINGS:
            raise ValueError(f"TrainConfig.packing must be one of {', '.join(map(repr, PACKINGS))}, got {packing!r}")
        self.corpus, self.seq_len, self.global_batch = corpus, seq_len, global_batch
        self.packing, self.seed, self.shuffle, self.window, self.drop_last = packing, seed, shuffle, window, drop_last
        self.buckets = tuple(sorted(buckets)) if buckets else default_buckets(seq_len)
        if self.buckets[-1] < seq_len:
            raise ValueError(f"TrainConfig.buckets {self.buckets} must reach seq_len={seq_len}")
        self.lengths = np.asarray([len(e.ids) for e in corpus.examples])
        self.groups = prefix_groups(corpus.examples, seq_len) if packing == "pack_prefixes" else None
        self.batches_per_epoch = len(self._epoch(0))
        if self.batches_per_epoch == 0:
            raise ValueError(
                f"{len(corpus.examples)} examples ({int(self.lengths.sum())} tokens) do not fill one global batch "
                f"of {global_batch} rows"
            )

    def _order(self, epoch: int) -> np.ndarray:
        n = len(self.corpus.examples)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    @functools.lru_cache(maxsize=4)
    def _epoch(self, epoch: int) -> tuple[BatchPlan, ...]:
        order = self._order(epoch)
        if self.packing == "pack":
            return self._pack(order)
        if self.packing == "pack_examples":
            rows = self._first_fit(order, self.lengths[order] - 1, epoch)
            return self._separate_plans([[(i, 0, int(self.lengths[i]), -1) for i in r] for r in rows])
        if self.packing == "pack_prefixes":
            group_order = np.random.default_rng([self.seed, epoch]).permutation(len(self.groups)) if self.shuffle \
                else np.arange(len(self.groups))
            rows = self._first_fit(group_order, np.asarray([self.groups[g].slots for g in group_order]), epoch)
            return self._separate_plans([self._group_pieces(r) for r in rows])
        return self._pad(order, epoch)

    def _first_fit(self, items: np.ndarray, sizes: np.ndarray, epoch: int) -> list[list[int]]:
        """Rows of `items` (each taking `sizes[k]` of a row's `seq_len` input slots): first-fit decreasing bin
        packing within windows of `window` x `global_batch` items, the rows then shuffled."""
        step = self.window * self.global_batch
        rows: list[list[int]] = []
        for w in range(0, len(items), step):
            part = np.argsort(-sizes[w : w + step], kind="stable") + w
            free: list[int] = []
            members: list[list[int]] = []
            for k in part.tolist():
                need = int(sizes[k])
                slot = next((r for r, f in enumerate(free) if f >= need), None)
                if slot is None:
                    free.append(self.seq_len - need)
                    members.append([int(items[k])])
                else:
                    free[slot] -= need
                    members[slot].append(int(items[k]))
            rows += members
        if self.shuffle:
            perm = np.random.default_rng([self.seed, epoch, 2]).permutation(len(rows))
            rows = [rows[i] for i in perm]
        return rows

    def _group_pieces(self, group_ids: list[int]) -> list[tuple[int, int, int, int]]:
        """A row's groups as pieces (example, start, stop, index of the trunk piece or -1)."""
        pieces: list[tuple[int, int, int, int]] = []
        for g in group_ids:
            trunk = len(pieces)
            for k, (i, start) in enumerate(self.groups[g].members):
                pieces.append((i, start, int(self.lengths[i]), -1 if k == 0 else trunk))
        return pieces

    def _separate_plans(self, rows: list[list[tuple[int, int, int, int]]]) -> tuple[BatchPlan, ...]:
        B = self.global_batch
        n_batches = len(rows) // B if self.drop_last else -(-len(rows) // B)
        plans = []
        for b in range(n_batches):
            chunk = rows[b * B : (b + 1) * B]
            chunk += [[]] * (B - len(chunk))
            trunks = tuple(tuple(t for *_, t in r) for r in chunk) if self.packing == "pack_prefixes" else None
            plans.append(BatchPlan(tuple(tuple((i, a, z) for i, a, z, _ in r) for r in chunk), self.seq_len,
                                   separate=True, trunks=trunks))
        return tuple(plans)

    def _pack(self, order: np.ndarray) -> tuple[BatchPlan, ...]:
        row_tokens = self.seq_len + 1
        rows, current, filled = [], [], 0
        for idx in order:
            pos, n = 0, int(self.lengths[idx])
            while pos < n:
                take = min(n - pos, row_tokens - filled)
                current.append((int(idx), pos, pos + take))
                pos, filled = pos + take, filled + take
                if filled == row_tokens:
                    rows.append(tuple(current))
                    current, filled = [], 0
        n_batches = len(rows) // self.global_batch
        return tuple(
            BatchPlan(tuple(rows[i * self.global_batch : (i + 1) * self.global_batch]), self.seq_len)
            for i in range(n_batches)
        )

    def _pad(self, order: np.ndarray, epoch: int) -> tuple[BatchPlan, ...]:
        B = self.global_batch
        chunk = self.window * B
        batches: list[np.ndarray] = []
        for w in range(0, len(order), chunk):
            part = order[w : w + chunk]
            part = part[np.argsort(self.lengths[part], kind="stable")]
            for b in range(0, len(part), B):
                batches.append(part[b : b + B])
        if self.drop_last:
            batches = [b for b in batches if len(b) == B]
        if self.shuffle:
            perm = np.random.default_rng([self.seed, epoch, 1]).permutation(len(batches))
            batches = [batches[i] for i in perm]
        plans = []
        for idxs in batches:
            need = int(self.lengths[idxs].max()) - 1
            length = next(b for b in self.buckets if b >= need)
            rows = tuple(((int(i), 0, int(self.lengths[i])),) for i in idxs)
            rows += ((),) * (B - len(rows))  # empty rows (eval's last batch): all padding, no loss
            plans.append(BatchPlan(rows, length))
        return tuple(plans)

    def plan(self, step: int) -> BatchPlan:
        epoch, i = divmod(step, self.batches_per_epoch)
        return self._epoch(epoch)[i]


def row_loss_counts(plan: BatchPlan, corpus: Corpus) -> np.ndarray:
    """Loss positions of every row of the global batch `plan`, as `materialize` lays the rows out."""
    counts = np.zeros(len(plan.rows), np.int64)
    for r, pieces in enumerate(plan.rows):
        if pieces and plan.separate:
            counts[r] = sum(int(corpus.examples[i].loss[a + 1:b].sum()) for i, a, b in pieces)
        elif pieces:
            counts[r] = int(np.concatenate([corpus.examples[i].loss[a:b] for i, a, b in pieces])[1:].sum())
    return counts


def head_positions(loss_mask_MxRxL: np.ndarray, groups: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """`(head_index, head_valid)`, each `[M, groups, capacity]`: the flat positions of the loss tokens within
    each group of `R / groups` consecutive rows (row-major over `rows x L`), padded with invalid zeros."""
    M, R, L = loss_mask_MxRxL.shape
    flat = loss_mask_MxRxL.reshape(M, groups, R // groups * L)
    index = np.zeros((M, groups, capacity), np.int32)
    valid = np.zeros((M, groups, capacity), bool)
    for m in range(M):
        for g in range(groups):
            pos = np.flatnonzero(flat[m, g])
            if len(pos) > capacity:
                raise ValueError(f"{len(pos)} loss positions in a group of rows, capacity {capacity}")
            index[m, g, :len(pos)], valid[m, g, :len(pos)] = pos, True
    return index, valid


def round_capacity(most: int, slots: int) -> int:
    """`most` loss positions of a group of `slots` rows x L rounded up to an eighth of the slots: few distinct
    shapes to compile, at most an eighth of the group wasted."""
    step = max(1, slots // 8)
    return min(slots, max(step, -(-most // step) * step))


def head_capacity(plan: BatchPlan, corpus: Corpus, micro_batches: int, groups: int) -> int:
    """Positions the LM head keeps per group: the largest group's loss count over the whole global batch (so
    every process agrees), `round_capacity`."""
    slots = len(plan.rows) // (micro_batches * groups) * plan.length
    return round_capacity(int(row_loss_counts(plan, corpus).reshape(micro_batches * groups, -1).sum(-1).max()), slots)


def run_head_capacities(planner: Planner, n_batches: int, micro_batches: int, groups: int) -> dict[int, int]:
    """The largest `head_capacity` of each row length over the run's first epoch (or its `n_batches`, if fewer):
    given to `materialize` as floors, so a run's steps take one shape per length. Per-batch capacities gave the
    SmolLM2 memory-write batches four shapes, i.e. four compilations and step buffers of four sizes."""
    floors: dict[int, int] = {}
    for k in range(min(n_batches, planner.batches_per_epoch)):
        plan = planner.plan(k)
        floors[plan.length] = max(floors.get(plan.length, 0), head_capacity(plan, planner.corpus, micro_batches, groups))
    return floors


def materialize(plan: BatchPlan, corpus: Corpus, *, pad_id: int, micro_batches: int, process_index: int = 0,
                process_count: int = 1, head_groups: int = 0,
                head_floors: Mapping[int, int] | None = None) -> dict[str, np.ndarray]:
    """This process's slice of one global batch, arrays shaped `[micro_batches, rows_per_process, L]`.

    `head_groups` > 0 adds `head_index` / `head_valid` (`train.step.HEAD_FIELDS`) for that many groups of rows
    per micro-batch (the batch shards; a multiple of `process_count`), with at least `head_floors[L]` positions
    per group (`run_head_capacities`)."""
    B, L = len(plan.rows), plan.length
    if B % (micro_batches * process_count):
        raise ValueError(f"global batch {B} is not divisible by micro_batches*process_count={micro_batches * process_count}")
    rows_per_micro = B // micro_batches
    local = rows_per_micro // process_count
    shape = (micro_batches, local, L)
    inputs = np.full(shape, pad_id, np.int32)
    targets = np.full(shape, pad_id, np.int32)
    loss_mask = np.zeros(shape, bool)
    attn_mask = np.zeros(shape, bool)
    segment_ids = np.zeros(shape, np.int32)
    positions = np.broadcast_to(np.arange(L, dtype=np.int32), shape).copy()
    prefixed = plan.trunks is not None
    prefix_segment_ids = np.zeros(shape, np.int32) if prefixed else None
    prefix_lengths = np.zeros(shape, np.int32) if prefixed else None
    for m in range(micro_batches):
        for r in range(local):
            row = m * rows_per_micro + process_index * local + r
            pieces = plan.rows[row]
            if not pieces:
                continue
            if plan.separate:  # examples, each shifted on its own, positions from its start, own segment
                at = 0
                for k, (i, a, b) in enumerate(pieces):
                    ids, flags = corpus.examples[i].ids[a:b], corpus.examples[i].loss[a:b]
                    n = len(ids) - 1
                    sl = slice(at, at + n)
                    inputs[m, r, sl], targets[m, r, sl], loss_mask[m, r, sl] = ids[:-1], ids[1:], flags[1:]
                    attn_mask[m, r, sl], segment_ids[m, r, sl] = True, k + 1
                    positions[m, r, sl] = a + np.arange(n)
                    trunk = plan.trunks[row][k] if prefixed else -1
                    if trunk >= 0:  # a branch: it also sees its trunk's first `a` tokens
                        prefix_segment_ids[m, r, sl], prefix_lengths[m, r, sl] = trunk + 1, a
                    at += n
                continue
            ids = np.concatenate([corpus.examples[i].ids[a:b] for i, a, b in pieces])
            flags = np.concatenate([corpus.examples[i].loss[a:b] for i, a, b in pieces])
            seg = np.concatenate([np.full(b - a, k + 1, np.int32) for k, (i, a, b) in enumerate(pieces)])
            n = len(ids) - 1
            inputs[m, r, :n] = ids[:-1]
            targets[m, r, :n] = ids[1:]
            loss_mask[m, r, :n] = flags[1:]
            attn_mask[m, r, :n] = True
            segment_ids[m, r, :n] = seg[:-1]
    out = dict(inputs=inputs, targets=targets, loss_mask=loss_mask, attn_mask=attn_mask, positions=positions,
               segment_ids=segment_ids)
    if prefixed:
        out.update(prefix_segment_ids=prefix_segment_ids, prefix_lengths=prefix_lengths)
    if head_groups:
        if head_groups % process_count or rows_per_micro % head_groups:
            raise ValueError(f"head_groups={head_groups} must divide the {rows_per_micro} rows of a micro-batch "
                             f"and be a multiple of the process count {process_count}")
        capacity = max(head_capacity(plan, corpus, micro_batches, head_groups), (head_floors or {}).get(L, 0))
        out["head_index"], out["head_valid"] = head_positions(loss_mask, head_groups // process_count, capacity)
    return out


class BatchSource:
    """Random access over the global batches of a run (grain's `MapDataset` source)."""

    def __init__(self, planner: Planner, n_batches: int, **materialize_kwargs: Any):
        self.planner, self.n_batches, self.kwargs = planner, n_batches, materialize_kwargs

    def __len__(self) -> int:
        return self.n_batches

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return materialize(self.planner.plan(index), self.planner.corpus, **self.kwargs)


def make_iterator(planner: Planner, n_batches: int, *, pad_id: int, micro_batches: int, process_index: int = 0,
                  process_count: int = 1, prefetch: int = 2, head_groups: int = 0,
                  head_floors: Mapping[int, int] | None = None):
    """A checkpointable grain iterator over this process's slices of `n_batches` global batches.

    `it.get_state()` / `it.set_state(state)` save and restore the position (a small JSON-able dict).
    """
    source = BatchSource(planner, n_batches, pad_id=pad_id, micro_batches=micro_batches,
                         process_index=process_index, process_count=process_count, head_groups=head_groups,
                         head_floors=head_floors)
    ds = grain.MapDataset.source(source)
    opts = grain.ReadOptions(num_threads=max(1, prefetch), prefetch_buffer_size=prefetch)
    return iter(ds.to_iter_dataset(opts))


def eval_batches(corpus: Corpus, *, seq_len: int, batch: int, pad_id: int, buckets: Sequence[int] = (),
                 process_index: int = 0, process_count: int = 1, head_groups: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """Every held-out example once, in file order, padded (the last batch is filled with empty rows)."""
    planner = Planner(corpus, seq_len=seq_len, global_batch=batch, packing="pad", seed=0, shuffle=False,
                      buckets=buckets, drop_last=False)
    for k in range(planner.batches_per_epoch):
        yield materialize(planner.plan(k), corpus, pad_id=pad_id, micro_batches=1,
                          process_index=process_index, process_count=process_count, head_groups=head_groups)
