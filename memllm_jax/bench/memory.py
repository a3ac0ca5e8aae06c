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
import json
import os
import pathlib
import shutil
import sqlite3
import tempfile
import time

import numpy as np

from memllm_jax.bench.timing import Timing, markdown_table, ratio_row
from memllm_jax.files import atomic_open

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


DATA_VERSION = 1
"""Bump when the synthetic generator changes: it keys the cached data and the original design's cache."""


def make_data(n_ent: int, seed: int) -> dict[str, np.ndarray]:
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
    return dict(ent=ent, rel=rel, s=s, r=r, o=o)


def make_queries(data: dict, seed: int, n_queries: int) -> dict[str, np.ndarray]:
    """Noisy copies of a stored triple's (subject, relation) or (object, relation); own random stream."""
    rng = np.random.default_rng([seed, len(data["ent"]), 1])
    s, r, o = data["s"], data["r"], data["o"]
    pick = rng.integers(0, len(s), n_queries)
    is_obj = rng.random(n_queries) < 0.5
    q_ent = noisy(rng, data["ent"][np.where(is_obj, s[pick], o[pick])])
    q_rel = noisy(rng, data["rel"][r[pick]])
    return dict(q_ent=q_ent, q_rel=q_rel, is_obj=is_obj)


def default_cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "memllm" / "bench_memory"


def load_data(n_ent: int, seed: int, cache_dir: pathlib.Path | None) -> tuple[dict, bool]:
    """Synthetic data from the cache (`data-v*-n*-seed*.npz`), else generated and cached atomically."""
    path = cache_dir / f"data-v{DATA_VERSION}-n{n_ent}-seed{seed}.npz" if cache_dir else None
    if path is not None and path.exists():
        try:
            with np.load(path) as z:
                return {k: z[k] for k in ("ent", "rel", "s", "r", "o")}, True
        except (OSError, ValueError, KeyError) as e:
            print(f"cache {path}: unreadable ({e}); regenerating", flush=True)
    data = make_data(n_ent, seed)
    if path is not None:
        with atomic_open(path, "wb") as f:
            np.savez(f, **data)
    return data, False


# ------------------------------------------------------------------------------------------- contenders


def build_ours(data, queries, cfg):
    """(memory, seconds spent in `TripleMemory.add`): making the 5M `Triple` objects is not timed."""
    from memllm_jax.memory import TripleMemory
    from memllm_jax.protocol import Triple

    enc = TableEncoder(DIM)
    enc.rows.update((f"E{i}", v) for i, v in enumerate(data["ent"]))
    enc.rows.update((f"R{i}", v) for i, v in enumerate(data["rel"]))
    enc.rows.update((f"QE{i}", v) for i, v in enumerate(queries["q_ent"]))
    enc.rows.update((f"QR{i}", v) for i, v in enumerate(queries["q_rel"]))
    mem = TripleMemory(enc, cfg)
    s, r, o = data["s"], data["r"], data["o"]
    step, seconds = 500_000, 0.0
    for start in range(0, len(s), step):
        sl = slice(start, start + step)
        batch = [Triple(f"E{a}", f"R{b}", f"E{c}") for a, b, c in zip(s[sl].tolist(), r[sl].tolist(), o[sl].tolist())]
        t0 = time.perf_counter()
        mem.add(batch, source="synthetic")
        seconds += time.perf_counter() - t0
    return mem, seconds


def queries_for(queries, idx):
    from memllm_jax.protocol import Query

    return [Query(f"QE{i}", f"QR{i}", None) if queries["is_obj"][i] else Query(None, f"QR{i}", f"QE{i}") for i in idx]


HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF = 20, 200, 300
"""The original implementation's HNSW settings."""


def build_original(data, directory: pathlib.Path) -> dict:
    """Build the original design's files (two HNSW indices + SQLite) into `directory` (created by a rename of
    a temp directory next to it, so a crash never leaves a half-built cache). Returns the build record."""
    import hnswlib

    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    os.chmod(tmp, 0o755)
    try:
        threads = os.cpu_count() or 1
        t0 = time.perf_counter()
        for name, vecs in (("hnsw_ent.bin", data["ent"]), ("hnsw_rel.bin", data["rel"])):
            index = hnswlib.Index(space="ip", dim=DIM)
            index.init_index(max_elements=len(vecs), M=HNSW_M, ef_construction=HNSW_EF_CONSTRUCTION, random_seed=0)
            step = 100_000
            for start in range(0, len(vecs), step):  # chunks only for progress lines; same insertion order
                index.add_items(vecs[start : start + step], np.arange(start, min(start + step, len(vecs))),
                                num_threads=threads)
                if len(vecs) > step:
                    print(f"  hnsw {name}: {min(start + step, len(vecs))}/{len(vecs)} "
                          f"({time.perf_counter() - t0:.0f}s)", flush=True)
            index.save_index(str(tmp / name))
        hnsw_s = time.perf_counter() - t0
        db = sqlite3.connect(tmp / "triples.sqlite")
        db.execute("CREATE TABLE triples (id INTEGER PRIMARY KEY, s INTEGER, r INTEGER, o INTEGER)")
        db.executemany("INSERT INTO triples (s, r, o) VALUES (?, ?, ?)",
                       zip(data["s"].tolist(), data["r"].tolist(), data["o"].tolist()))
        db.execute("CREATE INDEX by_sr ON triples (s, r)")
        db.execute("CREATE INDEX by_or ON triples (o, r)")
        db.commit()
        db.close()
        total = time.perf_counter() - t0
        meta = dict(seconds=total, hnsw_seconds=hnsw_s, sqlite_seconds=total - hnsw_s, threads=threads,
                    built_at=time.strftime("%Y-%m-%d %H:%M"), M=HNSW_M, ef_construction=HNSW_EF_CONSTRUCTION,
                    entities=len(data["ent"]), relations=len(data["rel"]), triples=len(data["s"]))
        (tmp / "build.json").write_text(json.dumps(meta, indent=1))
        os.replace(tmp, directory)
        return meta
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def original_files(data, n_ent: int, seed: int, cache_dir: pathlib.Path | None, work: pathlib.Path):
    """(directory, build record, from_cache): cached under `orig-v*-n*-seed*-M*-efc*` unless cache_dir is None."""
    if cache_dir is None:
        directory = work / "original"
        return directory, build_original(data, directory), False
    directory = cache_dir / f"orig-v{DATA_VERSION}-n{n_ent}-seed{seed}-M{HNSW_M}-efc{HNSW_EF_CONSTRUCTION}"
    meta_path = directory / "build.json"
    if meta_path.exists():
        return directory, json.loads(meta_path.read_text()), True
    return directory, build_original(data, directory), False


class OriginalDesign:
    """hnswlib over entity and relation embeddings + SQLite, one SELECT per candidate (entity, relation)."""

    def __init__(self, directory: pathlib.Path, cfg, k: int = 100):
        import hnswlib

        self.cfg, self.k = cfg, k
        self.indices = []
        for name in ("hnsw_ent.bin", "hnsw_rel.bin"):
            index = hnswlib.Index(space="ip", dim=DIM)
            index.load_index(str(directory / name))
            index.set_ef(HNSW_EF)
            self.indices.append(index)
        self.db = sqlite3.connect(f"file:{directory / 'triples.sqlite'}?mode=ro", uri=True, check_same_thread=False)

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


def run_size(n_ent: int, args) -> dict | None:
    from memllm_jax.config import MemoryConfig

    cfg = MemoryConfig(q_thr=10**9, scann_leaves_to_search_fraction=args.leaves_fraction,
                       partition_threshold=args.partition_threshold)
    cache_dir = None if args.no_cache else pathlib.Path(args.cache_dir)
    t0 = time.perf_counter()
    data, cached = load_data(n_ent, args.seed, cache_dir)
    print(f"[{n_ent}] synthetic data {'loaded from cache' if cached else 'generated'} in "
          f"{time.perf_counter() - t0:.1f}s: {n_ent} entities, {len(data['rel'])} relations, {len(data['s'])} triples",
          flush=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="memllm_bench_memory_"))
    try:
        orig_dir, orig_meta, orig_cached = original_files(data, n_ent, args.seed, cache_dir, work)
        print(f"[{n_ent}] original design: " + (f"from cache {orig_dir} (built {orig_meta['built_at']} in "
              if orig_cached else "built in ") + f"{orig_meta['seconds']:.1f}s: HNSW {orig_meta['hnsw_seconds']:.1f}s "
              f"on {orig_meta['threads']} threads, SQLite {orig_meta['sqlite_seconds']:.1f}s" +
              (")" if orig_cached else ""), flush=True)
        if args.prepare_only:
            return None
        queries = make_queries(data, args.seed, args.batches * args.batch)
        mem, add_s = build_ours(data, queries, cfg)
        all_q = queries_for(queries, range(args.batches * args.batch))
        t0 = time.perf_counter()
        mem.query(all_q[:1])  # first read builds the ScaNN indices and the adjacency
        index_s = time.perf_counter() - t0
        build_ours_s = add_s + index_s
        print(f"[{n_ent}] ours built in {build_ours_s:.1f}s: add {add_s:.1f}s, indices at the first read {index_s:.1f}s "
              f"(entities partitioned={mem.entities.index.partitioned}, relations "
              f"partitioned={mem.relations.index.partitioned})", flush=True)
        orig = OriginalDesign(orig_dir, cfg, k=args.k)
        mem.save(work / "ours")
        bpt_ours = _dir_bytes(work / "ours") / len(data["s"])
        bpt_orig = sum((orig_dir / f).stat().st_size for f in ("hnsw_ent.bin", "hnsw_rel.bin", "triples.sqlite"))
        bpt_orig /= len(data["s"])

        to_data = np.array([int(n[1:]) for n in mem.entities.names])  # our entity id -> synthetic index
        t0 = time.perf_counter()
        exact = [set(to_data[r.ids].tolist()) for r in mem.exact_view().query(all_q)]
        print(f"[{n_ent}] exact reference in {time.perf_counter() - t0:.1f}s; mean result size "
              f"{np.mean([len(x) for x in exact]):.2f}", flush=True)
        ours_t, orig_t = Timing("ours", []), Timing("original", [])
        ours_found, orig_found = [], []
        q_ent, q_rel, is_obj = queries["q_ent"], queries["q_rel"], queries["is_obj"]
        mem.query(all_q[: args.batch])  # warm caches
        orig.query(q_ent[: args.batch], q_rel[: args.batch], is_obj[: args.batch])
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
                    res = orig.query(q_ent[sl], q_rel[sl], is_obj[sl])
                    orig_t.seconds.append(time.perf_counter() - start)
                    orig_found += [set(r) for r in res]
        total = sum(len(x) for x in exact)
        recall = lambda found: sum(len(f & e) for f, e in zip(found, exact)) / max(total, 1)  # noqa: E731
        return dict(n=n_ent, triples=len(data["s"]), build_ours=build_ours_s, build_orig=orig_meta["seconds"],
                    orig_cached=orig_cached, orig_built_at=orig_meta["built_at"],
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
    parser.add_argument("--leaves-fraction", type=float, default=MemoryConfig().scann_leaves_to_search_fraction,
                        help="ScaNN leaves searched (partitioned; MemoryConfig.scann_leaves_to_search_fraction)")
    parser.add_argument("--partition-threshold", type=int, default=MemoryConfig().partition_threshold,
                        help="rows above which ScaNN partitions (MemoryConfig.partition_threshold)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=str(default_cache_dir()),
                        help="synthetic data and the original design's HNSW + SQLite files, by size, seed and "
                             "HNSW parameters (a second run skips their build and reports the cached build time)")
    parser.add_argument("--no-cache", action="store_true", help="build everything in a temp dir, cache nothing")
    parser.add_argument("--prepare-only", action="store_true",
                        help="only populate the cache (data + original design) for --sizes, then exit")


def main(args: argparse.Namespace) -> int:
    print(__doc__.split("\n\n")[0])
    print("Encoder: synthetic 384-d table (not MiniLM: embedding 1M names with MiniLM on 2 cores takes hours).")
    rows, cached_notes = [], []
    for n in [int(x) for x in args.sizes.split(",") if x]:
        r = run_size(n, args)
        if r is None:
            continue
        q = lambda t: np.quantile(t.seconds, [0.5, 0.99]) * 1e3  # noqa: E731
        (o50, o99), (b50, b99) = q(r["ours"]), q(r["orig"])
        qps_o = r["batch"] * len(r["ours"].seconds) / sum(r["ours"].seconds)
        qps_b = r["batch"] * len(r["orig"].seconds) / sum(r["orig"].seconds)
        print(f"[{n}] per-batch latency: ours vs original {ratio_row(r['ours'], r['orig'])}", flush=True)
        mark = "*" if r["orig_cached"] else ""
        if mark:
            cached_notes.append(f"{n:,}: built {r['orig_built_at']}")
        rows.append([f"{n:,}", f"{r['triples']:,}", f"{r['build_ours']:.1f} / {r['build_orig']:.1f}{mark}",
                     f"{r['bpt_ours']:.0f} / {r['bpt_orig']:.0f}", f"{o50:.2f} / {b50:.2f}", f"{o99:.2f} / {b99:.2f}",
                     f"{qps_o:,.0f} / {qps_b:,.0f}", f"**{qps_o / qps_b:.1f}x**",
                     f"{r['recall_ours']:.4f} / {r['recall_orig']:.4f}", f"{r['mean_results']:.2f}"])
    if not rows:
        return 0
    print()
    print(markdown_table(
        ["entities", "triples", "build s (ours / orig)", "bytes/triple", f"p50 ms/batch of {args.batch}",
         "p99 ms/batch", "queries/s", "throughput ratio", "recall vs exact", "mean |E|"], rows))
    if cached_notes:
        print(f"\n\\* original design's build time as measured when its files were built and cached in "
              f"{args.cache_dir} ({'; '.join(cached_notes)}); this run loaded them from the cache.")
    return 0
