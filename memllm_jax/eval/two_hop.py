"""Two-hop questions: a composite relation answered by two reads in one generation (beyond the paper, whose
Limitations say composite relations "are not detected or utilized").

Each question ("What is the country of the place of birth of X?", `data_gen.two_hop`) is asked as a Table 3
cloze is: BOS, the question, a read forced right after it. The reader trained on two-hop examples reads `X>>r1>>`,
states the result C, reads `C>>r2>>` and answers. Three conditions, each an exact-answer rate:
- with memory: the model's own reads, answered by a memory holding the one-hop facts;
- without memory: the same questions with an empty memory (every read finds nothing and is removed);
- gold reads: both reads and their results already in the prompt, the model only answers (the ceiling).
With memory it also reports how often the model chained a second read, and how often each read returned the
entity it needed (the middle entity, then the answer).

The answer is the plain text after the last complete call of the final context (after the question when no
call is left), up to the end of its clause, normalised as Table 3's answers.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

from memllm_jax import protocol
from memllm_jax.eval.editing import build_cloze_prompt_ids, clause_end_ids, extract_cloze_answer, normalize_answer

if TYPE_CHECKING:
    from memllm_jax.decode.reader import GenerationResult
    from memllm_jax.eval.scoring import ModelWork

TWO_HOP_KEY = "two_hop"
"""The block's key in the results (`results/two_hop.json`)."""


@dataclasses.dataclass(frozen=True)
class TwoHopQuestion:
    question: str
    subject: str
    first: str
    """The first hop's relation (subject -> middle)."""
    middle: str
    second: str
    """The second hop's relation (middle -> answer)."""
    answer: str

    def gold_reads(self) -> str:
        """The text of both reads with their results and the middle entity stated between them, as in training."""
        q1, q2 = protocol.Query(self.subject, self.first, None), protocol.Query(self.middle, self.second, None)
        return (protocol.format_read_call([q1]) + protocol.format_read_result([self.middle])
                + protocol.escape_text(" " + self.middle)
                + protocol.format_read_call([q2]) + protocol.format_read_result([self.answer]))


@dataclasses.dataclass
class TwoHopResult:
    n_questions: int
    exact_with_memory: float
    exact_without_memory: float
    exact_gold_reads: float
    chained: float
    """With memory: share of the questions on which the model made a second read after the forced one."""
    first_read_hit: float
    """With memory: share whose first read returned the middle entity."""
    second_read_hit: float
    """With memory: share with a later read that returned the answer."""
    examples: list[dict]
    keep_reads: bool = False
    """The first read stayed in the context when the second opened (the paper removes it)."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def final_answer(tok: Any, r: GenerationResult, question: str) -> str:
    """The plain text after the last complete call of `r`'s final context (after `question` when no call is left
    after it), up to the end of its clause."""
    text = tok.decode(list(r.prompt_ids) + list(r.token_ids))
    at = text.rfind(question.rstrip())
    tail = text[at + len(question.rstrip()):] if at >= 0 else r.text
    end = tail.rfind(protocol.CALL_END)
    return extract_cloze_answer(protocol.strip_calls(tail[end + len(protocol.CALL_END):] if end >= 0 else tail))


def ask(read_model: Any, tok: Any, memory: Any, questions: Sequence[TwoHopQuestion], *, gold_reads: bool = False,
        max_new_tokens: int = 64, batch_size: int = 16, keep_reads: bool = False,
        work: ModelWork | None = None) -> list[GenerationResult]:
    """Generate each question's answer: a read forced after the question, or (`gold_reads`) both reads given.
    `keep_reads`: the first read stays in the context when the second opens (`CallBook.keep_reads`)."""
    from memllm_jax.decode.reader import generate_with_memory  # here: the data commands import the questions' type

    if gold_reads:
        prompts = [[tok.bos_id] + tok.encode(protocol.escape_text(q.question.rstrip()) + q.gold_reads())
                   for q in questions]
    else:
        prompts = [build_cloze_prompt_ids(tok, q.question) for q in questions]
    res = generate_with_memory(read_model, tok, memory, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                               chunk=16, stop_ids=clause_end_ids(tok), keep_reads=keep_reads)
    for r in res if work is not None else ():
        work.generation(len(r.prompt_ids), len(r.token_ids), r.n_generated)
    return res


def _trace(r: GenerationResult) -> list[dict]:
    return [{"call": c.query_text, "result": list(c.result), "removed": c.reason if c.removed else ""}
            for c in r.calls]


def evaluate_two_hop(read_model: Any, tok: Any, memory: Any, empty_memory: Any, questions: Sequence[TwoHopQuestion],
                     *, max_new_tokens: int = 64, batch_size: int = 16, keep_reads: bool = False,
                     progress: Callable[[str], None] | None = None, work: ModelWork | None = None) -> TwoHopResult:
    """The three conditions (module docstring) on `questions`: `memory` holds the one-hop facts, `empty_memory`
    nothing; `keep_reads` as in `ask`."""
    say = progress or (lambda _m: None)
    kw = dict(max_new_tokens=max_new_tokens, batch_size=batch_size, keep_reads=keep_reads, work=work)
    say("  two-hop: with memory")
    own = ask(read_model, tok, memory, questions, **kw)
    say("  two-hop: without memory")
    bare = ask(read_model, tok, empty_memory, questions, **kw)
    say("  two-hop: with the gold reads")
    gold = ask(read_model, tok, memory, questions, gold_reads=True, **kw)
    answers = {name: [final_answer(tok, r, q.question) for r, q in zip(res, questions)]
               for name, res in (("own", own), ("bare", bare), ("gold", gold))}
    n = max(1, len(questions))

    same = lambda a, b: normalize_answer(a) == normalize_answer(b)  # noqa: E731

    def rate(hits) -> float:
        return sum(hits) / n

    def exact(name: str) -> float:
        return rate(same(a, q.answer) for a, q in zip(answers[name], questions))

    has = lambda entity, results: normalize_answer(entity) in {normalize_answer(x) for x in results}  # noqa: E731
    examples = [{"question": q.question, "middle": q.middle, "answer": q.answer, "with_memory": a,
                 "exact": same(a, q.answer), "trace": _trace(r), "without_memory": b, "gold_reads": g}
                for q, r, a, b, g in list(zip(questions, own, answers["own"], answers["bare"], answers["gold"]))[:20]]
    return TwoHopResult(len(questions), exact("own"), exact("bare"), exact("gold"),
                        rate(len(r.calls) >= 2 for r in own),
                        rate(bool(r.calls) and has(q.middle, r.calls[0].result) for r, q in zip(own, questions)),
                        rate(any(has(q.answer, c.result) for c in r.calls[1:]) for r, q in zip(own, questions)),
                        examples, keep_reads)
