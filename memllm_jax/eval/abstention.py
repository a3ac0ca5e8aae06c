"""Memory-aware answers: questions about facts the memory does not hold (beyond the paper, whose Limitations say
"MemLLM is not a memory-aware solution": when the memory has no answer the model answers from its weights or
hallucinates).

A memory-aware read model, read with `keep_empty` (an empty read stays in its context closed with nothing,
`protocol.format_empty_read`), answers such a question with `protocol.ABSTAIN`. The block asks each absent-fact
question as Table 3 asks its questions (`editing.ask_questions`: a forced read after it) of the memory holding the
sequential edits, and counts each answer as one of:
- abstained: the answer is the phrase (normalised as Table 3's answers);
- named guess: any other non-empty answer (it names something the memory did not give);
- no answer: an empty answer.
In a held-out world no model can know these facts, so a named guess is a hallucination; `correct_guess` counts the
named guesses that happen to be the fact's object all the same.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from memllm_jax import protocol
from memllm_jax.eval.editing import Answer, normalize_answer

ABSENT_KEY = "absent"
"""The block's key in Table 3's results, beside the regimes."""


@dataclasses.dataclass(frozen=True)
class AbsentQuestion:
    question: str
    """Asked as Table 3's questions are (a cloze sentence start, or a question in the QA prompt)."""
    answer: str = ""
    """The fact's object, which the memory does not hold ("" when not known)."""


@dataclasses.dataclass
class AbstentionResult:
    n_questions: int
    abstention: float
    """Share of the answers that are `protocol.ABSTAIN`."""
    named_guess: float
    """Share of the answers that name something (non-empty, not the phrase)."""
    correct_guess: float
    """Share of the answers that are the fact's object (from the weights, or a lucky guess)."""
    empty_reads: float
    """Share of the questions whose forced read returned nothing."""
    keep_empty: bool
    """Whether empty reads were kept in the context (otherwise removed, as in the paper)."""
    examples: list[dict]
    rel_present: float | None = None
    """REL of the same run's sequential regime: the edits' questions, about facts the memory holds."""
    gen_present: float | None = None
    """GEN of the same run's sequential regime."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def is_abstention(answer: str) -> bool:
    return normalize_answer(answer) == normalize_answer(protocol.ABSTAIN)


def score_abstention(questions: Sequence[AbsentQuestion], answers: Sequence[Answer], *, keep_empty: bool,
                     rel_present: float | None = None, gen_present: float | None = None) -> AbstentionResult:
    """The block's rates for the `answers` (`editing.ask_questions`) to `questions`; `rel_present` /
    `gen_present`: the present facts' scores shown next to them."""
    abstained = [is_abstention(a.text) for a in answers]
    named = [bool(a.text.strip()) and not x for a, x in zip(answers, abstained)]
    correct = [bool(q.answer) and normalize_answer(a.text) == normalize_answer(q.answer)
               for q, a in zip(questions, answers)]
    n = max(1, len(questions))
    examples = [{"question": q.question, "fact_object": q.answer, "answer": a.text, "read": list(a.read_results)}
                for q, a in list(zip(questions, answers))[:20]]
    return AbstentionResult(len(questions), sum(abstained) / n, sum(named) / n, sum(correct) / n,
                            sum(not a.read_results for a in answers) / n, keep_empty, examples, rel_present,
                            gen_present)
