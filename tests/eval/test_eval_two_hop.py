"""Two-hop questions (`eval.two_hop`): a scripted reader that chains two reads, the three conditions, the
answer taken after the last read, the block in the report and the page."""

import re

import pytest

from memllm_jax import protocol
from memllm_jax.eval import two_hop
from memllm_jax.eval.two_hop import TwoHopQuestion
from tests.support.eval_fakes import CharTokenizer

QUESTION = re.compile(r"What is the (.+) of the (.+) of (.+)\?")


def _chain_reader(chain: bool = True):
    """A scripted reader of "What is the r2 of the r1 of X?": its forced read asks X>>r1>>, it states the result C,
    opens a second read C>>r2>> and answers " <result>." (with `chain` False it answers C itself). A removed read
    leaves it guessing " Nowhere."."""
    from tests.support.scripted import PolicyModel

    tok = CharTokenizer()
    mr, rend, cend = (tok.marker_id[m] for m in (protocol.MEM_READ, protocol.READ_END, protocol.CALL_END))

    def policy(ctx):
        text = tok.decode(ctx[1:])
        m = QUESTION.match(text)
        if m is None:  # a prefix of the prompt
            return [tok.eos_id]
        second, first, subject = m.groups()
        q_end = ctx.index(tok.encode("?")[0]) + 1
        if mr not in ctx[q_end:]:  # every read removed
            after, target = tok.decode(ctx[q_end:]), " Nowhere."
        else:
            k = len(ctx) - 1 - ctx[::-1].index(mr)
            stated = protocol.strip_calls(tok.decode(ctx[q_end:k])).strip()
            gen = ctx[k + 1:]
            if rend not in gen:  # writing a query: of X, or of the entity stated before this read
                query = tok.encode(f"{stated}>>{second}>>" if stated else f"{subject}>>{first}>>") + [rend]
                return [query[len(gen)]]
            if cend not in gen:  # the memory answers here
                return [tok.eos_id]
            result, after = tok.decode(gen[gen.index(rend) + 1:gen.index(cend)]), tok.decode(gen[gen.index(cend) + 1:])
            if not stated and chain:  # the first read: state its result, then read again
                if after == f" {result}":
                    return [mr]
                target = f" {result}"
            else:
                target = f" {result}."
        return tok.encode(target[len(after)]) if len(after) < len(target) else [tok.eos_id]

    return PolicyModel(policy, tok.vocab_size), tok


def _memory():
    from memllm_jax.memory import TripleMemory
    from memllm_jax.memory.encoder import load_encoder

    enc = load_encoder("hash:16")
    mem = TripleMemory(enc)
    mem.add([protocol.Triple("Ann", "employer", "Kerek Group"), protocol.Triple("Kerek Group", "city", "Oslo"),
             protocol.Triple("Bo", "employer", "Vel Press"), protocol.Triple("Vel Press", "city", "Rome")],
            source="gold")
    return mem, TripleMemory(enc)


QUESTIONS = [TwoHopQuestion("What is the city of the employer of Ann?", "Ann", "employer", "Kerek Group", "city",
                            "Oslo"),
             TwoHopQuestion("What is the city of the employer of Bo?", "Bo", "employer", "Vel Press", "city", "Rome")]


@pytest.mark.slow
def test_a_reader_that_chains_two_reads_answers_with_memory_only():
    from experiments.report_html import two_hop_chains
    from experiments.tables import two_hop_markdown

    model, tok = _chain_reader()
    memory, empty = _memory()
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
    model, tok = _chain_reader(chain=False)
    memory, empty = _memory()
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

    model, tok = _chain_reader()
    memory, empty = _memory()
    res = two_hop.evaluate_two_hop(model, tok, memory, empty, QUESTIONS, max_new_tokens=60, batch_size=batch_size,
                                   keep_reads=True)
    assert (res.exact_with_memory, res.exact_without_memory, res.chained) == (1.0, 0.0, 1.0)
    first, second = res.examples[0]["trace"]
    assert (first["result"], first["removed"], second["result"], second["removed"]) == (["Kerek Group"], "", ["Oslo"], "")
    assert "kept in the context when the second opened" in two_hop_markdown(res.to_json())
