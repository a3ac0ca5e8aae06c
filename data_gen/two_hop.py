"""Two-hop questions over gold triples: the composite relations the paper's Limitations say MemLLM does not use
("from (Apple Inc., located in, California) and (California, country, United States) it cannot answer Apple's
country").

A path is (X, r1, C) and (C, r2, Y) with one object for each hop (so the question has one answer) and Y neither
X nor C. The question names both relations, outer first ("What is the country of the place of birth of X?");
the memory-read model answers it by a first read `X>>r1>>` whose result C it states, a second read `C>>r2>>`,
and the answer Y:

    What is the country of the place of birth of X?({MEM_READ(X>>place of birth>>)-->C}) C({MEM_READ(C>>country>>)-->Y}) Y

Stating C in the text is what lets the second read name it: the decoding core removes an earlier call from the
context when a new one opens (paper §3.2), so the second query is written after " C", with the first read gone.
The training examples are then the two contexts the reader meets: the question with the first read, C and the
second read's opening; then the question and C (the first read removed) with the second read and the answer. A
single example holding both reads trains a context that never occurs there: measured on seed 0, the reader trained
on it took the second read for a first one once the first had left the context, stated its result and read again
(exact answers 0.01, with the gold reads in the prompt 0.99). For a reader decoded with `keep_reads` (the first
read stays in the context), that single example is the context it meets, and is what it is trained on.
`two_hop_records` builds the examples from one document's triples; `two_hop_questions` the evaluation's questions
from the held-out documents' triples (`memllm_jax.eval.two_hop`).
"""

from __future__ import annotations

import random
from typing import Iterable, Sequence

from data_gen.docred import Document
from data_gen.gold_memory import gold_triples
from memllm_jax import protocol as P
from memllm_jax.eval.two_hop import TwoHopQuestion

TEMPLATES: tuple[str, ...] = ("What is the {second} of the {first} of {subject}?",
                              "Of the {first} of {subject}, what is the {second}?")
"""Two-hop questions name both relations, so the reader can tell which read comes first."""


def paths(triples: Iterable[P.Triple]) -> list[tuple[P.Triple, P.Triple]]:
    """Every (first, second) pair of triples with `first.object == second.subject` where `first` is the only
    triple of its subject and relation, `second` the only one of its subject and relation, and the answer is
    neither the start nor the middle entity; sorted, without duplicates."""
    triples = sorted(set(triples))
    objects: dict[tuple[str, str], list[str]] = {}
    by_subject: dict[str, list[P.Triple]] = {}
    for t in triples:
        objects.setdefault((t.subject, t.relation), []).append(t.object)
        by_subject.setdefault(t.subject, []).append(t)
    single = lambda t: len(objects[t.subject, t.relation]) == 1  # noqa: E731
    return [(first, second) for first in triples if single(first)
            for second in by_subject.get(first.object, ()) if single(second)
            and second.object not in (first.subject, first.object)]


def question(first: P.Triple, second: P.Triple, rng: random.Random) -> str:
    return rng.choice(TEMPLATES).format(first=first.relation, second=second.relation, subject=first.subject)


def two_hop_questions(gold: Iterable[P.Triple], n: int, seed: int = 0) -> list[TwoHopQuestion]:
    """Up to `n` two-hop questions over `gold` (`paths`), drawn at random, at most one per start entity and pair
    of relations."""
    found = paths(gold)
    rng = random.Random(f"two-hop:{seed}")
    rng.shuffle(found)
    asked: dict[tuple[str, str, str], TwoHopQuestion] = {}
    for first, second in found:
        if len(asked) >= n:
            break
        key = (first.subject, first.relation, second.relation)
        if key not in asked:
            asked[key] = TwoHopQuestion(question(first, second, rng), first.subject, first.relation, first.object,
                                        second.relation, second.object)
    return list(asked.values())


def with_distractors(entity: str, subject: str, triples: Sequence[P.Triple], share: float,
                     rng: random.Random) -> list[str]:
    """A read's results: `entity`, then with probability `share` up to two other objects of `subject` (best match
    first, as the memory orders them: its relation matching also returns near relations, e.g. the father with
    the mother)."""
    others = sorted({t.object for t in triples if t.subject == subject and t.object != entity})
    if not others or rng.random() >= share:
        return [entity]
    return [entity, *rng.sample(others, min(len(others), rng.choice((1, 2))))]


def two_hop_records(doc: Document, n: int, seed: int = 0, *, keep_reads: bool = False,
                    distractors: float = 0.0) -> list[dict]:
    """Up to `n` two-hop questions over the document's triples (drawn at random, seeded by `seed` and the document
    id), each as the contexts the reader meets (module docstring). Without `keep_reads`, two examples: the first
    read's, the question (no loss), the read of X and r1, its result (no loss), " " + C and the next read's opening
    `({MEM_READ(`, no EOS; the second read's, the question and " " + C (no loss), the read of C and r2, its result
    (no loss), " " + Y, EOS. With `keep_reads`, one example holding both reads. Marked `"two_hop": 1` / `2`
    (`1` for the single example). `distractors`: the share of reads whose results hold other entities after the right
    one (`with_distractors`)."""
    if n <= 0:
        return []
    triples = gold_triples(doc)
    found = paths(triples)
    rng = random.Random(f"read-two-hop:{seed}:{doc.doc_id}")
    rng.shuffle(found)
    out = []

    def results(t: P.Triple) -> list[str]:  # no draw without distractors: the examples stay as they were
        return with_distractors(t.object, t.subject, triples, distractors, rng) if distractors else [t.object]

    for first, second in found[:n]:
        results1, results2 = results(first), results(second)
        q1, q2 = P.Query(first.subject, first.relation, None), P.Query(second.subject, second.relation, None)
        asked = P.escape_text(question(first, second, rng))
        common = {"kind": "read", "doc": doc.doc_id, "read_index": 0}
        read1 = [{"text": asked, "loss": False}, {"text": P.format_read_call([q1]), "loss": True},
                 {"text": P.format_read_result(results1), "loss": False}]
        read2 = [{"text": P.format_read_call([q2]), "loss": True},
                 {"text": P.format_read_result(results2), "loss": False},
                 {"text": P.escape_text(" " + second.object), "loss": True}]
        answer2 = {"eos": True, "target": second.object, "queries": [[q2.subject, q2.relation, q2.object]],
                   "results": results2, "result_counts": [len(results2)]}
        if keep_reads:
            out.append({**common, "two_hop": 1, **answer2,
                        "segments": [*read1, {"text": P.escape_text(" " + first.object), "loss": True}, *read2]})
            continue
        out.append({
            **common, "two_hop": 1,
            "segments": [*read1, {"text": P.escape_text(" " + first.object) + P.MEM_READ, "loss": True}],
            "eos": False, "target": first.object, "queries": [[q1.subject, q1.relation, q1.object]],
            "results": results1, "result_counts": [len(results1)],
        })
        out.append({**common, "two_hop": 2, **answer2,
                    "segments": [{"text": asked, "loss": False},
                                 {"text": P.escape_text(" " + first.object), "loss": False}, *read2]})
    return out
