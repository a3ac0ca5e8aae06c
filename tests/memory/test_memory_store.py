"""Insert / dedup / replace / delete semantics against a plain-set model; bad input is rejected whole."""

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memllm_jax.config import MemoryConfig
from memllm_jax.memory import HashEncoder, MemoryInputError, TripleMemory
from memllm_jax.protocol import Query, Triple

ENTS = ["a", "b", "c", "d", "e"]
RELS = ["p", "q", "r"]
triple_st = st.builds(Triple, st.sampled_from(ENTS), st.sampled_from(RELS), st.sampled_from(ENTS))
op_st = st.one_of(
    st.tuples(st.just("add"), st.lists(triple_st, max_size=6), st.booleans()),
    st.tuples(st.just("del_triples"), st.lists(triple_st, max_size=3)),
    st.tuples(st.just("del_entity"), st.sampled_from(ENTS)),
    st.tuples(st.just("del_relation"), st.sampled_from(RELS)),
)


def stored(mem):
    return {(r["subject"], r["relation"], r["object"]) for r in mem.records()}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op_st, max_size=12))
def test_operations_match_set_model(ops):
    mem = TripleMemory(HashEncoder(8), MemoryConfig(index="exact"))
    model: set[tuple[str, str, str]] = set()
    ids: dict[tuple, int] = {}
    for op in ops:
        if op[0] == "add":
            _, triples, replace = op
            keys = [(t.subject, t.relation, t.object) for t in triples]
            if replace:
                new_sr = {(s, r): set() for s, r, _ in keys}
                for s, r, o in keys:
                    new_sr[(s, r)].add(o)
                model = {k for k in model if (k[0], k[1]) not in new_sr or k[2] in new_sr[(k[0], k[1])]}
            got = mem.add(triples, source="doc", replace=replace)
            for k, i in zip(keys, got):
                if k in model and k in ids:
                    assert ids[k] == i  # dedup keeps the stored id
                ids[k] = i
            model |= set(keys)
            assert len(set(got)) == len(set(keys))
        elif op[0] == "del_triples":
            n = mem.delete_triples(op[1])
            assert n == len({(t.subject, t.relation, t.object) for t in op[1]} & model)
            model -= {(t.subject, t.relation, t.object) for t in op[1]}
        elif op[0] == "del_entity":
            gone = {k for k in model if op[1] in (k[0], k[2])}
            assert mem.delete_entity(op[1]) == len(gone)
            model -= gone
            assert op[1] not in mem.entities.ids
        else:
            gone = {k for k in model if k[1] == op[1]}
            assert mem.delete_relation(op[1]) == len(gone)
            model -= gone
        assert stored(mem) == model
        assert mem.stats()["triples"] == len(model)
    # queries never return deleted triples' ends
    loose = MemoryConfig(tau_entity=0.999, tau_relation=0.999, tau_result=0.999, index="exact")
    for s in ENTS:
        for r in RELS:
            res = mem.query([Query(s, r, None)], loose)[0]
            assert sorted(res.entities) == sorted({k[2] for k in model if k[0] == s and k[1] == r})


def test_provenance_and_insertion_order():
    mem = TripleMemory(HashEncoder(8), MemoryConfig(index="exact"))
    mem.add([Triple("a", "p", "b")], source="doc1/sent0")
    mem.add([Triple("b", "p", "c"), Triple("a", "p", "b")], source="doc2/sent3")
    recs = mem.records()
    assert [(r["subject"], r["source"], r["seq"]) for r in recs] == [("a", "doc1/sent0", 0), ("b", "doc2/sent3", 1)]


@pytest.mark.parametrize(
    "triple, fragment",
    [
        (Triple("", "p", "b"), "triple 1: subject: empty"),
        (Triple("a", "   ", "b"), "triple 1: relation: empty"),
        (Triple("a", "p", "x" * 600), "triple 1: object: name has 600 characters"),
    ],
)
def test_bad_names_rejected_whole(triple, fragment):
    mem = TripleMemory(HashEncoder(8), MemoryConfig(index="exact"))
    with pytest.raises(MemoryInputError, match=fragment):
        mem.add([Triple("ok", "p", "fine"), triple])
    assert mem.stats()["triples"] == 0 and len(mem.entities) == 0
    with pytest.raises(MemoryInputError, match="query 0: entity"):
        mem.query([Query("  ", "p", None)])


def test_nan_embeddings_rejected_whole():
    class NanEncoder(HashEncoder):
        def encode(self, names):
            out = super().encode(names)
            out[[i for i, n in enumerate(names) if n == "poison"]] = np.nan
            return out

    mem = TripleMemory(NanEncoder(8), MemoryConfig(index="exact"))
    mem.add([Triple("a", "p", "b")])
    with pytest.raises(MemoryInputError, match="non-finite embedding for name 'poison'"):
        mem.add([Triple("c", "p", "d"), Triple("poison", "p", "a")])
    assert stored(mem) == {("a", "p", "b")} and set(mem.entities.ids) == {"a", "b"}


def test_each_name_embedded_once():
    class Counting(HashEncoder):
        calls: list = []

        def encode(self, names):
            self.calls.extend(names)
            return super().encode(names)

    enc = Counting(8)
    mem = TripleMemory(enc, MemoryConfig(index="exact"))
    mem.add([Triple("a", "p", "b"), Triple("b", "p", "a")])
    mem.query([Query("a", "p", None), Query("zz", "p", None), Query(None, "p", "zz")])
    mem.query([Query("zz", "q", None)])
    assert sorted(enc.calls) == ["a", "b", "p", "q", "zz"]


def test_concurrent_readers_and_writer():
    mem = TripleMemory(HashEncoder(64), MemoryConfig(index="scann", index_delta_min=64))
    errors = []

    def writer():
        for i in range(300):
            mem.add([Triple(f"s{i}", "rel", f"o{i}")], source=f"w{i}")

    def reader():
        try:
            for i in range(300):
                for res in mem.query([Query(f"s{j}", "rel", None) for j in range(0, 300, 37)]):
                    assert len(res.entities) <= 1
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert mem.query([Query("s299", "rel", None)])[0].entities == ["o299"]
