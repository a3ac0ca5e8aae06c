"""`memllm bench memory`: TripleMemory (ScaNN + vectorised join) vs the original design (hnswlib HNSW
indices, M=20, ef_construction=200, ef=300, + SQLite tables queried once per (candidate entity, candidate
relation) pair), measured interleaved in one run on the same synthetic memory and queries.

Synthetic data (384-d, MiniLM's width): names come in surface-variant groups of 1-3 (like "US"/"USA"),
grouped into topics, all sharing a common direction (sentence embeddings are anisotropic), so unrelated
names have cosine ~0.1, same-topic ~0.35, variants ~0.83. Relations are built the same way, one per 50
entities; 5 triples per entity. Queries are noisy copies (cosine ~0.9) of a stored triple's subject and
relation (object queries) or object and relation (subject queries). Vectors are generated directly and
served by a table encoder: running MiniLM over a million synthetic names would take hours on 2 cores.

Recall = found (query, entity) results / results of the exact definition (brute force over every row).
Bytes per triple = on-disk size (our snapshot directory; HNSW index files + SQLite file) / triples.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sqlite3
import tempfile
import time

import numpy as np

from memllm_jax.bench.timing import Timing, markdown_table, ratio_row

DIM = 384


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def synth_vectors(rng: np.random.Generator, n: int, g: np.ndarray, n_topics: int) -> np.ndarray:
    sizes = rng.choice([1, 2, 3], size=n, p=[0.6, 0.25, 0.15])
    group = np.repeat(np.arange(n), sizes)[:n]  # contiguous groups of surface variants
    topics = _unit(rng.standard_normal((n_topics, DIM)))
    out = np.empty((n, DIM), np.float32)
    bounds = np.append(np.searchsorted(group, np.arange(0, group[-1] + 1, 1 << 15)), n)  # at group boundaries
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        gid = group[lo:hi]
        uniq, inv = np.unique(gid, return_inverse=True)
        base = _unit(rng.standard_normal((len(uniq), DIM)))[inv]
        base = _unit(0.3 * g + 0.5 * topics[gid % n_topics] + 0.81 * base)
        out[lo:hi] = _unit(base + 0.45 * _unit(rng.standard_normal((hi - lo, DIM))))
    return out


def noisy(rng: np.random.Generator, v: np.ndarray, scale: float = 0.45) -> np.ndarray:
    return _unit(v + scale * _unit(rng.standard_normal(v.shape)))


class TableEncoder:
    """Serves pre-generated vectors by name (a legitimate Encoder: a fixed lookup table)."""

    def __init__(self, dim: int):
        self.name, self.dim = "synthetic-table", dim
        self.rows: dict[str, np.ndarray] = {}

    def encode(self, names):
        return np.stack([self.rows[n] for n in names]) if names else np.zeros((0, self.dim), np.float32)


def make_data(n_ent: int, seed: int, n_queries: int):
    rng = np.random.default_rng(seed)
    g = _unit(rng.standard_normal(DIM))
    n_rel = max(50, n_ent // 50)
    ent = synth_vectors(rng, n_ent, g, max(10, n_ent // 1000))
    rel = synth_vectors(rng, n_rel, g, max(5, n_rel // 20))
    n_t = 5 * n_ent
    s, r, o = rng.integers(0, n_ent, n_t), rng.integers(0, n_rel, n_t), rng.integers(0, n_ent, n_t)
    key = np.unique((s * n_rel + r) * n_ent + o)
    o, sr = key % n_ent, key // n_ent
    s, r = sr // n_rel, sr % n_rel
    pick = rng.integers(0, len(s), n_queries)
    is_obj = rng.random(n_queries) < 0.5
    q_ent = noisy(rng, ent[np.where(is_obj, s[pick], o[pick])])
    q_rel = noisy(rng, rel[r[pick]])
    return dict(ent=ent, rel=rel, s=s, r=r, o=o, q_ent=q_ent, q_rel=q_rel, is_obj=is_obj)


# ------------------------------------------------------------------------------------------- contenders


def build_ours(data, cfg):
    from memllm_jax.memory import TripleMemory
    from memllm_jax.protocol import Triple

    enc = TableEncoder(DIM)
    enc.rows.update((f"E{i}", v) for i, v in enumerate(data["ent"]))
    enc.rows.update((f"R{i}", v) for i, v in enumerate(data["rel"]))
    enc.rows.update((f"QE{i}", v) for i, v in enumerate(data["q_ent"]))
    enc.rows.update((f"QR{i}", v) for i, v in enumerate(data["q_rel"]))
    mem = TripleMemory(enc, cfg)
    s, r, o = data["s"], data["r"], data["o"]
    step = 500_000
    for start in range(0, len(s), step):
        sl = slice(start, start + step)
        mem.add([Triple(f"E{a}", f"R{b}", f"E{c}") for a, b, c in zip(s[sl].tolist(), r[sl].tolist(), o[sl].tolist())],
                source="synthetic")
    return mem


def queries_for(data, idx):
    from memllm_jax.protocol import Query

    return [Query(f"QE{i}", f"QR{i}", None) if data["is_obj"][i] else Query(None, f"QR{i}", f"QE{i}") for i in idx]


class OriginalDesign:
    """hnswlib over entity and relation embeddings + SQLite, one SELECT per candidate (entity, relation)."""

    def __init__(self, data, cfg, workdir: pathlib.Path, k: int = 100):
        import hnswlib

        self.cfg, self.k = cfg, k
        self.indices = []
        for vecs in (data["ent"], data["rel"]):
            index = hnswlib.Index(space="ip", dim=DIM)
            index.init_index(max_elements=len(vecs), M=20, ef_construction=200, random_seed=0)
            index.add_items(vecs, np.arange(len(vecs)), num_threads=os.cpu_count() or 1)
            index.set_ef(300)
            self.indices.append(index)
        self.db_path = workdir / "original.sqlite"
        self.db = sqlite3.connect(self.db_path, check_same_thread=False)
        self.db.execute("CREATE TABLE triples (id INTEGER PRIMARY KEY, s INTEGER, r INTEGER, o INTEGER)")
        self.db.executemany("INSERT INTO triples (s, r, o) VALUES (?, ?, ?)",
                            zip(data["s"].tolist(), data["r"].tolist(), data["o"].tolist()))
        self.db.execute("CREATE INDEX by_sr ON triples (s, r)")
        self.db.execute("CREATE INDEX by_or ON triples (o, r)")
        self.db.commit()
        for i, index in enumerate(self.indices):
            index.save_index(str(workdir / f"hnsw{i}.bin"))

    def query(self, q_ent, q_rel, is_obj):
        c = self.cfg
        k_e, k_r = min(self.k, self.indices[0].element_count), min(self.k, self.indices[1].element_count)
        le, de = self.indices[0].knn_query(q_ent, k=k_e)
        lr, dr = self.indices[1].knn_query(q_rel, k=k_r)
        out = []
        for i in range(len(q_ent)):
            ents = [(int(e), 1 - float(d)) for e, d in zip(le[i], de[i]) if 1 - d >= c.tau_entity]
            rels = [(int(t), 1 - float(d)) for t, d in zip(lr[i], dr[i]) if 1 - d >= c.tau_relation]
            sql = ("SELECT o FROM triples WHERE s = ? AND r = ?" if is_obj[i]
                   else "SELECT s FROM triples WHERE o = ? AND r = ?")
            best: dict[int, float] = {}
            for e, ce in ents:
                for t, ct in rels:
                    score = 0.5 * (ce + ct)
                    if score < c.tau_result:
                        continue
                    for (x,) in self.db.execute(sql, (e, t)):
                        best[x] = max(best.get(x, -1.0), score)
            out.append(sorted(best, key=lambda x: (-best[x], x)))
        return out


def _dir_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_size(n_ent: int, args) -> dict:
    from memllm_jax.config import MemoryConfig

    cfg = MemoryConfig(q_thr=10**9, scann_leaves_to_search_fraction=args.leaves_fraction,
                       partition_threshold=args.partition_threshold)
    t0 = time.perf_counter()
    data = make_data(n_ent, args.seed, args.batches * args.batch)
    print(f"[{n_ent}] synthetic data in {time.perf_counter() - t0:.1f}s: {n_ent} entities, {len(data['rel'])} "
          f"relations, {len(data['s'])} triples", flush=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="memllm_bench_memory_"))
    try:
        t0 = time.perf_counter()
        mem = build_ours(data, cfg)
        all_q = queries_for(data, range(args.batches * args.batch))
        mem.query(all_q[:1])  # first read builds the ScaNN index and the adjacency
        build_ours_s = time.perf_counter() - t0
        mem.encoder.rows = {k: v for k, v in mem.encoder.rows.items() if k.startswith("Q")}  # free the table
        print(f"[{n_ent}] ours built in {build_ours_s:.1f}s (partitioned={mem.entities.index.partitioned})", flush=True)
        t0 = time.perf_counter()
        orig = OriginalDesign(data, cfg, work, k=args.k)
        build_orig_s = time.perf_counter() - t0
        print(f"[{n_ent}] original design built in {build_orig_s:.1f}s", flush=True)
        mem.save(work / "ours")
        bpt_ours = _dir_bytes(work / "ours") / len(data["s"])
        bpt_orig = (sum(_dir_bytes(p) if p.is_dir() else p.stat().st_size
                        for p in work.iterdir() if p.name != "ours")) / len(data["s"])

        to_data = np.array([int(n[1:]) for n in mem.entities.names])  # our entity id -> synthetic index
        t0 = time.perf_counter()
        exact = [set(to_data[r.ids].tolist()) for r in mem.exact_view().query(all_q)]
        print(f"[{n_ent}] exact reference in {time.perf_counter() - t0:.1f}s; mean result size "
              f"{np.mean([len(x) for x in exact]):.2f}", flush=True)
        ours_t, orig_t = Timing("ours", []), Timing("original", [])
        ours_found, orig_found = [], []
        mem.query(all_q[: args.batch])  # warm caches
        orig.query(data["q_ent"][: args.batch], data["q_rel"][: args.batch], data["is_obj"][: args.batch])
        for b in range(args.batches):
            sl = slice(b * args.batch, (b + 1) * args.batch)
            order = (0, 1) if b % 2 == 0 else (1, 0)  # interleaved, alternating who goes first
            for who in order:
                start = time.perf_counter()
                if who == 0:
                    res = mem.query(all_q[sl])
                    ours_t.seconds.append(time.perf_counter() - start)
                    ours_found += [set(to_data[r.ids].tolist()) for r in res]
                else:
                    res = orig.query(data["q_ent"][sl], data["q_rel"][sl], data["is_obj"][sl])
                    orig_t.seconds.append(time.perf_counter() - start)
                    orig_found += [set(r) for r in res]
        total = sum(len(x) for x in exact)
        recall = lambda found: sum(len(f & e) for f, e in zip(found, exact)) / max(total, 1)  # noqa: E731
        return dict(n=n_ent, triples=len(data["s"]), build_ours=build_ours_s, build_orig=build_orig_s,
                    bpt_ours=bpt_ours, bpt_orig=bpt_orig, ours=ours_t, orig=orig_t, recall_ours=recall(ours_found),
                    recall_orig=recall(orig_found), batch=args.batch, mean_results=total / len(exact))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from memllm_jax.config import MemoryConfig

    parser.add_argument("--sizes", default="10000,100000", help="entity counts, comma separated (e.g. 1000000)")
    parser.add_argument("--batch", type=int, default=16, help="queries per batched call")
    parser.add_argument("--batches", type=int, default=40, help="batches timed per contender")
    parser.add_argument("--k", type=int, default=100, help="neighbours the original design asks HNSW for")
    parser.add_argument("--leaves-fraction", type=float, default=0.02, help="ScaNN leaves searched (partitioned)")
    parser.add_argument("--partition-threshold", type=int, default=MemoryConfig().partition_threshold,
                        help="rows above which ScaNN partitions (MemoryConfig.partition_threshold)")
    parser.add_argument("--seed", type=int, default=0)


def main(args: argparse.Namespace) -> int:
    print(__doc__.split("\n\n")[0])
    print("Encoder: synthetic 384-d table (not MiniLM: embedding 1M names with MiniLM on 2 cores takes hours).")
    rows = []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        r = run_size(n, args)
        q = lambda t: np.quantile(t.seconds, [0.5, 0.99]) * 1e3  # noqa: E731
        (o50, o99), (b50, b99) = q(r["ours"]), q(r["orig"])
        qps_o = r["batch"] * len(r["ours"].seconds) / sum(r["ours"].seconds)
        qps_b = r["batch"] * len(r["orig"].seconds) / sum(r["orig"].seconds)
        print(f"[{n}] per-batch latency: ours vs original {ratio_row(r['ours'], r['orig'])}", flush=True)
        rows.append([f"{n:,}", f"{r['triples']:,}", f"{r['build_ours']:.1f} / {r['build_orig']:.1f}",
                     f"{r['bpt_ours']:.0f} / {r['bpt_orig']:.0f}", f"{o50:.2f} / {b50:.2f}", f"{o99:.2f} / {b99:.2f}",
                     f"{qps_o:,.0f} / {qps_b:,.0f}", f"**{qps_o / qps_b:.1f}x**",
                     f"{r['recall_ours']:.4f} / {r['recall_orig']:.4f}", f"{r['mean_results']:.2f}"])
    print()
    print(markdown_table(
        ["entities", "triples", "build s (ours / orig)", "bytes/triple", f"p50 ms/batch of {args.batch}",
         "p99 ms/batch", "queries/s", "throughput ratio", "recall vs exact", "mean |E|"], rows))
    return 0
