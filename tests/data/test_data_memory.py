"""Read examples against a real TripleMemory filled with gold triples."""

import pytest

from data_gen.docred import documents_from_raw
from data_gen.gold_memory import GoldLookup, fill_memory, gold_triples, memory_query_fn, unique_gold_triples
from data_gen.read_examples import scan_read_points
from data_gen.synthetic import iter_synthetic, synthetic_rel_info

memory = pytest.importorskip("memllm_jax.memory")


def test_filled_memory_agrees_with_gold_lookup():
    from memllm_jax.config import MemoryConfig

    docs = list(documents_from_raw(iter_synthetic(40, seed=5), synthetic_rel_info()))
    mem = memory.TripleMemory(memory.load_encoder("hash:256"), MemoryConfig())
    n = fill_memory(mem, docs, batch_docs=7)
    assert n == sum(len(gold_triples(d)) for d in docs)
    # the scaling stage's base memory is built from this list: same triples, same order, so the same answers
    ordered = unique_gold_triples(docs)
    stored = [(r["subject"], r["relation"], r["object"]) for r in mem.records()]
    assert stored == [(t.subject, t.relation, t.object) for t in ordered]
    assert len(ordered) < n  # the synthetic documents restate facts, so the order of first occurrences matters
    gold = GoldLookup().add_documents(docs)
    qfn = memory_query_fn(mem)
    agree = total = 0
    for d in docs:
        for pt in scan_read_points(d, qfn):
            total += 1
            agree += pt.targets[0].text in pt.merged_results
        assert len(scan_read_points(d, gold)) >= 0
    assert total and agree / total > 0.8
