"""Regressions found by running the main job."""

import pytest

from memllm_jax import protocol
from memllm_jax.decode.reader import generate_with_memory
from tests.decode.test_decode_reader import EOS, TOK, FakeMemory, scripted


@pytest.mark.slow
def test_new_call_keeps_a_complete_call_that_came_with_the_prompt():
    """A few-shot prompt holds a complete read; the model's own new read stays in the context (it is the caller's), and nothing crashes."""
    mem = FakeMemory({("y", "r", None): ["Rome"]})
    prompt_ids = [TOK.bos_id] + TOK.encode("Q({MEM_READ(x>>r>>)-->P})|")
    model = scripted("({MEM_READ(y>>r>>)-->Rome})z")
    [res] = generate_with_memory(model, TOK, mem, [prompt_ids], max_new_tokens=40, chunk=8)
    assert res.finish_reason == "eos"
    assert res.text == "({MEM_READ(y>>r>>)-->Rome})z"
    assert [c.queries[0].subject for c in res.calls] == ["y"]
    assert EOS not in TOK.encode(res.text)


def test_an_over_long_query_name_from_the_model_finds_nothing_instead_of_raising():
    """The real memory refuses names over MemoryConfig.max_name_chars; model output must not crash a read."""
    from memllm_jax.config import MemoryConfig
    from memllm_jax.memory import TripleMemory
    from memllm_jax.memory.encoder import HashEncoder

    mem = TripleMemory(HashEncoder(dim=16), MemoryConfig(max_name_chars=8))
    mem.add([protocol.Triple("y", "r", "Rome")])
    long_name = "z" * 20
    model = scripted(f"({{MEM_READ({long_name}>>r>>)-->", "ok")
    [res] = generate_with_memory(model, TOK, mem, ["Q|"], max_new_tokens=60, chunk=8)
    assert res.finish_reason == "eos" and res.text == "ok"
    assert res.calls[0].removed and res.calls[0].reason == "empty"
