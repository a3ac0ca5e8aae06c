"""Judge examples: is a triple one of the document's facts, as the text up to a sentence states it?

A memory-write model trained on Re-DocRED writes many triples that are not among the gold ones (the entities
reversed, a relation the sentence does not state, an entity the sentence names beside the right one, another
mention's spelling of a name). A judge adapter reads the text up to a sentence and one candidate triple and answers
" yes" or " no" (`protocol.format_judge_prompt`, `protocol.JUDGE_ANSWERS`); the memory keeps what the judge accepts.

For sentence i the context is the sentence with the (windowed) text before it, as the memory-write prompt has it
(`write_examples.iter_write_items`). Positives: the sentence's memory-write targets (evidence rule as the writer's
training data) whose names are the gold triples' names. Negatives, each not a gold triple of the document by name:
- the sentence's targets under another spelling of a name ("alias": what a writer copies from the sentence when the
  document first named the entity otherwise),
- a positive reversed ("reversed"),
- a positive with another relation seen between entities of the same types in the training documents ("relation"),
- a positive with its subject or object replaced by another entity of the same type the context names ("entity"),
- two entities the sentence and its context name, with a relation seen between their types ("pair"; the only kind
  for a sentence with no positive).
Records are ordered by document and sentence, so a document's examples share their context as a token prefix
(`packing="pack_prefixes"` lays it out once).
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from typing import Iterable, Sequence

from data_gen.docred import Document
from data_gen.gold_memory import gold_triples
from data_gen.write_examples import DEFAULT_PRETEXT_SENTENCES, _full_mentions_by_sentence, iter_write_items
from memllm_jax import protocol as P
from memllm_jax.decode.judge import judge_context
from memllm_jax.eval.write_quality import triple_key

NEGATIVE_KINDS = ("alias", "reversed", "relation", "entity", "pair")


@dataclasses.dataclass(frozen=True)
class JudgeItem:
    sent_id: int
    context: str
    triple: P.Triple
    label: bool
    kind: str
    """"positive" or one of `NEGATIVE_KINDS`."""


def relations_by_types(docs: Iterable[Document]) -> dict[tuple[str, str], list[str]]:
    """(head entity type, tail entity type) -> the relation labels the documents hold between such entities."""
    seen: dict[tuple[str, str], set[str]] = defaultdict(set)
    for doc in docs:
        for rel in doc.relations:
            seen[(doc.entities[rel.head].type, doc.entities[rel.tail].type)].add(rel.label)
    return {k: sorted(v) for k, v in seen.items()}


def judge_items(doc: Document, types: dict[tuple[str, str], list[str]], negatives: int = 2, seed: int = 0,
                pretext_sentences: int | None = DEFAULT_PRETEXT_SENTENCES) -> list[JudgeItem]:
    """The document's judge examples (module docstring): per sentence its positives and `negatives` negatives per
    positive (one for a sentence without positives), drawn at random seeded by `seed` and the document id."""
    rng = random.Random(f"judge:{seed}:{doc.doc_id}")
    gold = {triple_key(t) for t in gold_triples(doc)}
    per_sent = _full_mentions_by_sentence(doc)

    out: list[JudgeItem] = []
    for item in iter_write_items(doc, pretext_sentences, evidence=True):
        i = item.sent_id
        w0 = 0 if pretext_sentences is None else max(0, i - pretext_sentences)
        context = judge_context(doc, i, len(doc.sentences) if pretext_sentences is None else pretext_sentences)
        names: dict[int, str] = {}
        for j in range(w0, i):
            for e, ms in per_sent[j].items():
                names[e] = ms[-1].text
        for e, ms in per_sent[i].items():
            names[e] = ms[0].text

        entity_of = {n: e for e, n in names.items()}
        in_sentence = sorted(per_sent[i])
        positives = [t for t in item.triples if triple_key(t) in gold]
        aliases = [t for t in item.triples if triple_key(t) not in gold]
        candidates: dict[str, list[P.Triple]] = {k: [] for k in NEGATIVE_KINDS}
        candidates["alias"] = aliases
        for t in positives:
            s, o = entity_of.get(t.subject), entity_of.get(t.object)
            candidates["reversed"].append(P.Triple(t.object, t.relation, t.subject))
            if s is None or o is None:
                continue
            s_type, o_type = doc.entities[s].type, doc.entities[o].type
            candidates["relation"] += [P.Triple(t.subject, r, t.object) for r in types.get((s_type, o_type), ())
                                       if r != t.relation]
            candidates["entity"] += [P.Triple(t.subject, t.relation, n) for e, n in names.items()
                                     if e not in (s, o) and doc.entities[e].type == o_type]
            candidates["entity"] += [P.Triple(n, t.relation, t.object) for e, n in names.items()
                                     if e not in (s, o) and doc.entities[e].type == s_type]
        for a in in_sentence:
            for b, n in names.items():
                if a != b:
                    for r in types.get((doc.entities[a].type, doc.entities[b].type), ()):
                        candidates["pair"].append(P.Triple(names[a], r, n))
        out += [JudgeItem(i, context, t, True, "positive") for t in positives]
        wanted = negatives * len(positives) if positives else 1
        pool = {k: [t for t in v if triple_key(t) not in gold] for k, v in candidates.items()}
        chosen: set[tuple[str, str, str]] = set()
        for _ in range(wanted):
            kinds = [k for k, v in pool.items() if v]
            if not kinds:
                break
            kind = rng.choice(kinds)
            t = pool[kind].pop(rng.randrange(len(pool[kind])))
            if triple_key(t) not in chosen:
                chosen.add(triple_key(t))
                out.append(JudgeItem(i, context, t, False, kind))
    return out


def judge_record(doc: Document, item: JudgeItem) -> dict:
    return {"kind": "judge", "doc": doc.doc_id, "sent_id": item.sent_id, "label": item.label, "negative": item.kind,
            "triple": [item.triple.subject, item.triple.relation, item.triple.object],
            "segments": [{"text": P.format_judge_prompt(item.context, item.triple), "loss": False},
                         {"text": P.JUDGE_ANSWERS[0] if item.label else P.JUDGE_ANSWERS[1], "loss": True}],
            "eos": False}


def judge_records(docs: Sequence[Document], negatives: int = 2, seed: int = 0) -> list[dict]:
    types = relations_by_types(docs)
    return [judge_record(doc, item) for doc in docs for item in judge_items(doc, types, negatives, seed)]
