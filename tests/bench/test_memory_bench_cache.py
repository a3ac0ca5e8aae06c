"""`memllm bench memory` cache: synthetic data and the original design's files are reused, not rebuilt."""

import numpy as np

from memllm_jax.bench import memory as bm
from memllm_jax.config import MemoryConfig


def test_data_and_original_design_cached(tmp_path):
    data, cached = bm.load_data(300, 1, tmp_path)
    again, cached2 = bm.load_data(300, 1, tmp_path)
    assert not cached and cached2
    for k in ("ent", "rel", "s", "r", "o"):
        np.testing.assert_array_equal(data[k], again[k])
    assert not list(tmp_path.glob(".*"))  # no temp files left behind

    work = tmp_path / "work"
    work.mkdir()
    d1, meta1, c1 = bm.original_files(data, 300, 1, tmp_path, work)
    d2, meta2, c2 = bm.original_files(data, 300, 1, tmp_path, work)
    assert (c1, c2) == (False, True) and d1 == d2 and meta1 == meta2
    assert meta1["M"] == 20 and meta1["ef_construction"] == 200 and meta1["triples"] == len(data["s"])
    assert not list(work.iterdir())  # built in the cache, not the work dir

    # the cached original design answers like the exact definition on this tiny memory (HNSW is exact here)
    cfg = MemoryConfig(q_thr=10**9, index="exact")
    queries = bm.make_queries(data, 1, 32)
    mem, _ = bm.build_ours(data, queries, cfg)
    to_data = np.array([int(n[1:]) for n in mem.entities.names])
    exact = [sorted(to_data[r.ids].tolist()) for r in mem.query(bm.queries_for(queries, range(32)))]
    orig = bm.OriginalDesign(d1, cfg).query(queries["q_ent"], queries["q_rel"], queries["is_obj"])
    assert [sorted(x) for x in orig] == exact
    assert sum(map(len, exact)) > 0
