"""The memory's tables (paper §3.1, Figure 1): name tables (entities, relations) and the triple table with
provenance, plus the adjacency lists the query join uses.

Ids are row positions and never reused; deletion clears an alive flag. Adjacency by subject, by object and
by relation is a sorted base (CSR-style: row order + sorted keys) and an unsorted delta of rows added since
the last sort, merged once the delta outgrows a fraction of the base, so an insert costs O(1) amortised and
is visible to the next lookup.
"""

from __future__ import annotations

import numpy as np

from memllm_jax.memory.index import ExactIndex, ScannIndex


class NameTable:
    """Unique names with ids and embeddings (kept in the vector index)."""

    def __init__(self, index: ExactIndex | ScannIndex):
        self.index = index
        self.names: list[str | None] = []
        self.ids: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, names: list[str], vecs_NxE: np.ndarray) -> np.ndarray:
        rows = self.index.add(vecs_NxE)
        self.names.extend(names)
        for name, row in zip(names, rows):
            self.ids[name] = int(row)
        return rows

    def remove(self, row: int) -> None:
        name = self.names[row]
        if name is not None:
            del self.ids[name]
            self.names[row] = None
            self.index.remove(np.array([row]))

    def vector(self, row: int) -> np.ndarray:
        return self.index.rows.vectors[row]


def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= len(a):
        return a
    out = np.zeros((max(need, 2 * len(a), 64),) + a.shape[1:], a.dtype)
    out[: len(a)] = a
    return out


class Adjacency:
    """Triple rows grouped by one key column; `lookup(keys)` -> (position in `keys`, triple row)."""

    def __init__(self, delta_min: int = 2048, delta_fraction: float = 0.05):
        self.delta_min, self.delta_fraction = delta_min, delta_fraction
        self.sorted_keys = np.zeros(0, np.int64)
        self.sorted_rows = np.zeros(0, np.int64)
        self.n_sorted = 0  # triple rows [0, n_sorted) are in the sorted base

    def refresh(self, key_col: np.ndarray, n: int) -> None:
        if n - self.n_sorted > max(self.delta_min, self.delta_fraction * self.n_sorted):
            order = np.argsort(key_col[:n], kind="stable")
            self.sorted_rows = order.astype(np.int64)
            self.sorted_keys = key_col[:n][order].astype(np.int64)
            self.n_sorted = n

    def lookup(self, keys: np.ndarray, key_col: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        keys = np.asarray(keys, np.int64)
        lo = np.searchsorted(self.sorted_keys, keys, "left")
        hi = np.searchsorted(self.sorted_keys, keys, "right")
        counts = hi - lo
        pos = np.repeat(np.arange(len(keys)), counts)
        offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
        rows = self.sorted_rows[np.repeat(lo, counts) + offsets]
        if n > self.n_sorted:  # the unsorted delta: a vectorised scan
            delta = key_col[self.n_sorted : n]
            order = np.argsort(keys, kind="stable")
            sk = keys[order]
            at = np.clip(np.searchsorted(sk, delta), 0, max(len(sk) - 1, 0))
            hit = np.nonzero((sk[at] == delta) if len(sk) else np.zeros(len(delta), bool))[0]
            if len(hit):
                # every position in `keys` holding that key gets the row (keys may repeat)
                k_lo = np.searchsorted(sk, delta[hit], "left")
                k_hi = np.searchsorted(sk, delta[hit], "right")
                c = k_hi - k_lo
                off = np.arange(c.sum()) - np.repeat(np.cumsum(c) - c, c)
                pos = np.concatenate([pos, order[np.repeat(k_lo, c) + off]])
                rows = np.concatenate([rows, np.repeat(hit + self.n_sorted, c)])
        return pos, rows


class TripleTable:
    """Columns s, r, o, seq (insertion order), src (index into `sources`), alive."""

    COLS = ("s", "r", "o", "seq", "src")

    def __init__(self):
        self.n = 0
        self.cols = {c: np.zeros(0, np.int64) for c in self.COLS}
        self.alive_col = np.zeros(0, bool)
        self.keys: dict[tuple[int, int, int], int] = {}
        self.sources: list[str] = []
        self.source_ids: dict[str, int] = {}
        self.next_seq = 0
        self.by = {c: Adjacency() for c in ("s", "r", "o")}

    def __len__(self) -> int:
        return len(self.keys)

    def source_id(self, source: str) -> int:
        if source not in self.source_ids:
            self.source_ids[source] = len(self.sources)
            self.sources.append(source)
        return self.source_ids[source]

    def append(self, s, r, o, seq, src, alive=None) -> np.ndarray:
        """Append rows (`alive` False marks placeholder rows, used when reopening a memory with gaps)."""
        m = len(s)
        alive = np.ones(m, bool) if alive is None else np.asarray(alive, bool)
        need = self.n + m
        for c, v in zip(self.COLS, (s, r, o, seq, src)):
            self.cols[c] = _grow(self.cols[c], need)
            self.cols[c][self.n : need] = v
        self.alive_col = _grow(self.alive_col, need)
        self.alive_col[self.n : need] = alive
        rows = np.arange(self.n, need)
        live = np.nonzero(alive)[0]
        self.keys.update(zip(zip(np.asarray(s)[live].tolist(), np.asarray(r)[live].tolist(),
                                 np.asarray(o)[live].tolist()), rows[live].tolist()))
        self.n = need
        self.next_seq = max(self.next_seq, int(np.max(seq)) + 1) if m else self.next_seq
        return rows

    def remove(self, rows) -> None:
        for row in np.asarray(rows, np.int64).tolist():
            if self.alive_col[row]:
                self.alive_col[row] = False
                del self.keys[(int(self.cols["s"][row]), int(self.cols["r"][row]), int(self.cols["o"][row]))]

    def alive(self) -> np.ndarray:
        return self.alive_col[: self.n]

    def col(self, c: str) -> np.ndarray:
        return self.cols[c][: self.n]

    def lookup(self, by: str, keys) -> tuple[np.ndarray, np.ndarray]:
        """Alive triple rows whose column `by` equals keys[pos]: returns (pos, row)."""
        self.by[by].refresh(self.cols[by], self.n)  # lazily: a bulk load sorts once, at the first read
        pos, rows = self.by[by].lookup(np.asarray(keys, np.int64), self.cols[by], self.n)
        keep = self.alive_col[rows]
        return pos[keep], rows[keep]
