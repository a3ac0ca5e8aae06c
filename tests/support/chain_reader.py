"""A scripted reader that chains two memory reads for "What is the r2 of the r1 of X?", and a memory holding the
facts of its two questions (`tests/eval/test_eval_two_hop.py`, the chat's `keep_reads`)."""

import re

from memllm_jax import protocol
from tests.support.eval_fakes import CharTokenizer

QUESTION = re.compile(r"What is the (.+) of the (.+) of (.+)\?")


def chain_reader(chain: bool = True):
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


def two_hop_memory():
    from memllm_jax.memory import TripleMemory
    from memllm_jax.memory.encoder import load_encoder

    enc = load_encoder("hash:16")
    mem = TripleMemory(enc)
    mem.add([protocol.Triple("Ann", "employer", "Kerek Group"), protocol.Triple("Kerek Group", "city", "Oslo"),
             protocol.Triple("Bo", "employer", "Vel Press"), protocol.Triple("Vel Press", "city", "Rome")],
            source="gold")
    return mem, TripleMemory(enc)
