"""Figure 4's ratio counts the memory's distinct entity and relation records per stored triple."""

from memllm_jax import protocol
from memllm_jax.eval.scaling import memory_growth
from memllm_jax.memory.encoder import load_encoder


def test_memory_growth_ratio():
    T = protocol.Triple
    triples = [T("a", "r", "b"), T("a", "r", "c"), T("b", "s", "c"), T("a", "r", "b"), T("d", "r", "a")]
    growth = memory_growth(load_encoder("hash:16"), triples, [2, 3, 5, 99])
    assert [g["added"] for g in growth] == [2, 3, 5]
    g2, g3, g5 = growth
    assert (g2["triples"], g2["entities"], g2["relations"]) == (2, 3, 1)
    assert g2["records_per_triple"] == (3 + 1) / 2
    assert (g3["triples"], g3["relations"]) == (3, 2)
    assert (g5["triples"], g5["entities"]) == (4, 4)  # the duplicate is stored once
    assert g5["records_per_triple"] == (4 + 2) / 4 and g5["one_vector_per_fact"] == 1.0
