"""Two-hop questions (`eval.two_hop`): a scripted reader that chains two reads, the three conditions, the
answer taken after the last read, the block in the report and the page."""

import pytest

from memllm_jax import protocol
from memllm_jax.eval import two_hop
from memllm_jax.eval.two_hop import TwoHopQuestion
from tests.support.chain_reader import chain_reader, two_hop_memory
from tests.support.eval_fakes import CharTokenizer

QUESTIONS = [TwoHopQuestion("What is the city of the employer of Ann?", "Ann", "employer", "Kerek Group", "city",
                            "Oslo"),
             TwoHopQuestion("What is the city of the employer of Bo?", "Bo", "employer", "Vel Press", "city", "Rome")]


@pytest.mark.slow
def test_a_reader_that_chains_two_reads_answers_with_memory_only():
    from experiments.report_html import two_hop_chains
    from experiments.tables import two_hop_markdown

    model, tok = chain_reader()
    memory, empty = two_hop_memory()
    res = two_hop.evaluate_two_hop(model, tok, memory, empty, QUESTIONS, max_new_tokens=60, batch_size=2)
    assert (res.exact_with_memory, res.exact_without_memory, res.exact_gold_reads) == (1.0, 0.0, 1.0)
    assert (res.chained, res.first_read_hit, res.second_read_hit) == (1.0, 1.0, 1.0)
    first, second = res.examples[0]["trace"]
    # the first read leaves the context when the second opens (paper §3.2); the middle entity stays as text
    assert (first["call"], first["result"], first["removed"]) == ("({MEM_READ(Ann>>employer>>)-->", ["Kerek Group"],
                                                                  "new_call")
    assert (second["call"], second["result"], second["removed"]) == ("({MEM_READ(Kerek Group>>city>>)-->", ["Oslo"], "")
    assert [e["with_memory"] for e in res.examples] == ["Oslo", "Rome"]
    assert [e["without_memory"] for e in res.examples] == ["Nowhere"] * 2
    md = two_hop_markdown(res.to_json())
    assert "**Two-hop questions** — 2 questions" in md and "| with memory (the model's reads) | 1.00 |" in md
    assert "| without memory | 0.00 |" in md
    page = two_hop_chains(res.to_json())
    assert "Kerek Group&gt;&gt;city" in page and "removed: new_call" in page and "✓" in page


@pytest.mark.slow
def test_a_reader_that_stops_after_one_read_answers_the_middle_entity():
    model, tok = chain_reader(chain=False)
    memory, empty = two_hop_memory()
    res = two_hop.evaluate_two_hop(model, tok, memory, empty, QUESTIONS, max_new_tokens=60, batch_size=2)
    assert (res.exact_with_memory, res.chained, res.first_read_hit, res.second_read_hit) == (0.0, 0.0, 1.0, 0.0)
    assert [e["with_memory"] for e in res.examples] == ["Kerek Group", "Vel Press"]
    assert res.exact_gold_reads == 1.0  # given both reads, it answers after the last


def test_the_answer_is_the_text_after_the_last_read():
    tok = CharTokenizer()
    q = QUESTIONS[0]
    prompt = [tok.bos_id] + tok.encode(q.question)
    for generated, answer in [(q.gold_reads() + " Oslo. And more", "Oslo"), (" Oslo, surely", "Oslo"),
                              ("({MEM_READ(Ann>>employer>>)-->})", ""), ("", "")]:
        ids = tok.encode(generated)
        from memllm_jax.decode.reader import GenerationResult

        r = GenerationResult(prompt, ids, tok.decode(ids), protocol.strip_calls(tok.decode(ids)), [], "eos", len(ids))
        assert two_hop.final_answer(tok, r, q.question) == answer
    assert q.gold_reads() == ("({MEM_READ(Ann>>employer>>)-->Kerek Group}) Kerek Group"
                              "({MEM_READ(Kerek Group>>city>>)-->Oslo})")


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [1, 2], ids=["host_reads", "in_loop_reads"])
def test_with_keep_reads_the_first_read_stays_in_the_context(batch_size):
    from experiments.tables import two_hop_markdown

    model, tok = chain_reader()
    memory, empty = two_hop_memory()
    res = two_hop.evaluate_two_hop(model, tok, memory, empty, QUESTIONS, max_new_tokens=60, batch_size=batch_size,
                                   keep_reads=True)
    assert (res.exact_with_memory, res.exact_without_memory, res.chained) == (1.0, 0.0, 1.0)
    first, second = res.examples[0]["trace"]
    assert (first["result"], first["removed"], second["result"], second["removed"]) == (["Kerek Group"], "", ["Oslo"], "")
    assert "kept in the context when the second opened" in two_hop_markdown(res.to_json())
