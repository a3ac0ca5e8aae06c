"""Memory-write examples (paper §3.2-3.3, Figure 2a).

For sentence s_i the input is `pretext + ({USER_ST}) + s_i + ({USER_END})` and the target is the write
call with every gold triple such that one entity has a full (non-pronoun) mention in s_i and the other a
full mention in s_i or in the pretext. Triples are ordered by the position in s_i of the mention that
completes them; sentences without triples give the empty call `({MEM_WRITE-->})`. The loss covers only the
write call and EOS.

Evidence (`evidence=True`, paper §3.3 and Appendix B): a triple is a target of s_i only when s_i is evidence for
its relation: a sentence in the relation's `evidence` annotation or, for a relation without one (most of the triples
Re-DocRED added to DocRED), a sentence that names both its entities. The paper keeps Re-DocRED's triples at their
annotated evidence and has an LLM judge the unannotated ones; the sentences naming both entities stand in for that
judge here. Without the rule (the default), a triple is a target of every sentence that names one of its entities
while the other is named in the sentence or its pretext. In Re-DocRED's test file 73% of those targets are not
annotated as stated by their sentence (19% have evidence elsewhere, 54% no annotation), and a model trained on
them learns to write facts its sentence does not state.

Names: an entity is written with the text of its first full mention in s_i, else of its last full mention
in the (windowed) pretext, i.e. the surface form the model can see.

Context-free examples (`context_free_items`, optional): a later sentence of the document with its pretext
dropped, the target holding only the triples whose two entities are both named in it. Without them every
example with an empty pretext is a document's first sentence, which in a biography states birth, death and
citizenship; a model trained so writes those facts for any lone sentence that starts with a person's name
(an edit such as "X studied at the University of Y." got date of birth / date of death / citizenship triples
with made-up dates), instead of the fact the sentence states.

Lone phrase-relation examples (`lone_phrase_items`, optional): the sentences that state a fact of a relation
outside the label set ("Y was X's mentor."), each with its pretext dropped. In a document such a sentence is about
its focus, named before it; a model trained only so writes a lone "Y was X's mentor." (a Table 3 edit) in the order
of the names, `Y>>mentor>>X`, or takes "The mentor of X" for the subject.

Question-form examples (`question_form_items`, optional): one triple of the document asked as a question and
answered in the form of Table 3's edits (paper §4.3: "What city was X born? It is or they are Naples"), e.g.
"Which country is Naples in? It is or they are Italy" -> `Naples>>country>>Italy`. Built from the training
documents' own triples (no ZsRE text), the question drawn from the relation's natural questions or the two that
spell its label out (`relation_questions`); without them the model has seen no question with its answer after it
and, given an edit, writes the question's subject with an object of its own instead of the answer.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Iterable, Iterator

from data_gen.docred import Document, Mention
from data_gen.relation_questions import ask
from data_gen.synth_world import is_phrase_id
from memllm_jax import protocol as P

DEFAULT_PRETEXT_SENTENCES = 10


@dataclasses.dataclass(frozen=True)
class WriteItem:
    sent_id: int
    pretext: str
    sentence: str
    triples: tuple[P.Triple, ...]
    relation_ids: tuple[int, ...]
    """Index into `Document.relations` of each triple."""
    merged: tuple[tuple[int, int], ...] = ()
    """(relation index, relation index it duplicates): relations whose triple text equals an emitted one."""


def _full_mentions_by_sentence(doc: Document) -> list[dict[int, list[Mention]]]:
    per_sent: list[dict[int, list[Mention]]] = [dict() for _ in doc.sentences]
    for ent in doc.entities:
        for m in ent.full_mentions:
            per_sent[m.sent_id].setdefault(ent.index, []).append(m)
    return per_sent


def evidence_sentences(doc: Document, per_sent: list[dict[int, list[Mention]]] | None = None) -> list[frozenset[int]]:
    """Per relation: its annotated evidence sentences, else the sentences that name both its entities (module
    docstring, "Evidence")."""
    per_sent = per_sent if per_sent is not None else _full_mentions_by_sentence(doc)
    return [frozenset(rel.evidence) if rel.evidence else
            frozenset(j for j, ents in enumerate(per_sent) if rel.head in ents and rel.tail in ents)
            for rel in doc.relations]


def iter_write_items(doc: Document, pretext_sentences: int | None = DEFAULT_PRETEXT_SENTENCES,
                     evidence: bool = False) -> Iterator[WriteItem]:
    per_sent = _full_mentions_by_sentence(doc)
    stated_in = evidence_sentences(doc, per_sent) if evidence else None
    for i, (s_start, s_end) in enumerate(doc.sentences):
        w0 = 0 if pretext_sentences is None else max(0, i - pretext_sentences)
        p_start = doc.sentences[w0][0] if w0 < i else s_start
        in_sent = per_sent[i]
        last_in_pretext: dict[int, Mention] = {}
        for j in range(w0, i):
            for e, ms in per_sent[j].items():
                last_in_pretext[e] = ms[-1]
        candidates = []  # (sort key, triple, relation index)
        seen: dict[P.Triple, int] = {}
        merged = []
        for r_idx, rel in enumerate(doc.relations):
            if rel.head == rel.tail or (stated_in is not None and i not in stated_in[r_idx]):
                continue
            h_in, t_in = rel.head in in_sent, rel.tail in in_sent
            if not (h_in or t_in):
                continue
            if not (h_in and t_in) and not ((h_in and rel.tail in last_in_pretext) or (t_in and rel.head in last_in_pretext)):
                continue
            h_m = in_sent[rel.head][0] if h_in else last_in_pretext[rel.head]
            t_m = in_sent[rel.tail][0] if t_in else last_in_pretext[rel.tail]
            if h_in and t_in:
                key = max(h_m.span[0], t_m.span[0])
            else:
                key = (h_m if h_in else t_m).span[0]
            triple = P.Triple(h_m.text, rel.label, t_m.text)
            if triple in seen:
                merged.append((r_idx, seen[triple]))
                continue
            seen[triple] = r_idx
            candidates.append((key, r_idx, triple))
        candidates.sort(key=lambda c: (c[0], c[1]))
        yield WriteItem(i, doc.text[p_start:s_start], doc.text[s_start:s_end],
                        tuple(c[2] for c in candidates), tuple(c[1] for c in candidates), tuple(merged))


def _draw_lone(doc: Document, n: int, key: str, evidence: bool, keep=lambda item: True) -> list[WriteItem]:
    """Up to `n` sentences after the first that state a triple between two entities they name and pass `keep`,
    drawn at random (seeded by `key`), each as an example with no pretext, in document order."""
    if n <= 0:
        return []
    lone = [item for item in iter_write_items(doc, pretext_sentences=0, evidence=evidence)
            if item.sent_id > 0 and item.triples and keep(item)]
    rng = random.Random(key)
    return sorted(rng.sample(lone, min(n, len(lone))), key=lambda item: item.sent_id)


def context_free_items(doc: Document, n: int, seed: int = 0, evidence: bool = False) -> list[WriteItem]:
    """Up to `n` sentences after the first, drawn at random (seeded by `seed` and the document id) among those
    that state a triple between two entities they name, each as an example with no pretext."""
    return _draw_lone(doc, n, f"{seed}:{doc.doc_id}", evidence)


def lone_phrase_items(doc: Document, n: int, seed: int = 0, evidence: bool = False,
                      skip: Iterable[int] = ()) -> list[WriteItem]:
    """As `context_free_items`, among the sentences that state a phrase-relation fact (`synth_world.is_phrase_id`)
    and are not in `skip`."""
    skip = set(skip)
    return _draw_lone(doc, n, f"phrases:{seed}:{doc.doc_id}", evidence,
                      lambda item: item.sent_id not in skip
                      and any(is_phrase_id(doc.relations[r].pid) for r in item.relation_ids))


@dataclasses.dataclass(frozen=True)
class AskedTriple:
    """A triple of a document asked as a natural question about its subject and relation."""
    question: str
    triple: P.Triple
    sent_id: int
    relation_id: int
    answers: tuple[str, ...]
    """Every object the document states for the triple's subject and relation, the triple's own first."""


def asked_triples(doc: Document, n: int, seed: int = 0, salt: str = "question",
                  evidence: bool = False) -> list[AskedTriple]:
    """Up to `n` distinct triples whose two entities one sentence names (drawn at random, seeded by `salt`, `seed`
    and the document id), each with a question about its subject and relation (`relation_questions.ask`)."""
    if n <= 0:
        return []
    found: dict[P.Triple, tuple[int, int]] = {}
    for item in iter_write_items(doc, pretext_sentences=0, evidence=evidence):
        for triple, r_idx in zip(item.triples, item.relation_ids):
            found.setdefault(triple, (item.sent_id, r_idx))
    rng = random.Random(f"{salt}:{seed}:{doc.doc_id}")
    chosen = rng.sample(sorted(found), min(n, len(found)))
    objects = lambda t: tuple(dict.fromkeys([t.object] + [u.object for u in found if u.subject == t.subject  # noqa: E731
                                                          and u.relation == t.relation]))
    return [AskedTriple(ask(t.subject, t.relation, doc.relations[found[t][1]].pid, rng), t, *found[t], objects(t))
            for t in chosen]


def question_form_items(doc: Document, n: int, seed: int = 0, evidence: bool = False) -> list[WriteItem]:
    """`asked_triples`, each question followed by `protocol.WRITE_BRIDGE` and the triple's object, with no
    pretext; the target is that one triple."""
    return [WriteItem(a.sent_id, "", a.question + P.WRITE_BRIDGE + a.triple.object, (a.triple,), (a.relation_id,))
            for a in asked_triples(doc, n, seed, evidence=evidence)]


def write_record(doc: Document, item: WriteItem) -> dict:
    return {
        "kind": "write",
        "doc": doc.doc_id,
        "sent_id": item.sent_id,
        "segments": [
            {"text": P.format_write_prompt(item.pretext, item.sentence), "loss": False},
            {"text": P.format_write_call(item.triples), "loss": True},
        ],
        "eos": True,
        "triples": [[t.subject, t.relation, t.object] for t in item.triples],
    }


def taught_triples(docs: Iterable[Document], pretext_sentences: int | None = DEFAULT_PRETEXT_SENTENCES,
                   evidence: bool = False) -> list[P.Triple]:
    """Every triple the sentences' memory-write examples of `docs` hold (`iter_write_items`): what a memory-write
    model that reproduced its training calls exactly would write. Scored against the gold triples, it is the
    ceiling a trained writer's precision / recall are read against (the pipeline's diagnostics report it)."""
    return [t for doc in docs for item in iter_write_items(doc, pretext_sentences, evidence) for t in item.triples]


def write_coverage(doc: Document, pretext_sentences: int | None = DEFAULT_PRETEXT_SENTENCES,
                   evidence: bool = False) -> list[dict]:
    """For every gold relation: the sentences whose write example contains it, or why none does."""
    emitted: dict[int, list[int]] = {}
    merged_into: dict[int, tuple[int, int]] = {}
    for item in iter_write_items(doc, pretext_sentences, evidence):
        for r_idx in item.relation_ids:
            emitted.setdefault(r_idx, []).append(item.sent_id)
        for r_idx, other in item.merged:
            merged_into.setdefault(r_idx, (other, item.sent_id))
    per_sent = _full_mentions_by_sentence(doc)
    out = []
    for r_idx, rel in enumerate(doc.relations):
        entry = {"relation": r_idx, "head": rel.head, "tail": rel.tail, "pid": rel.pid, "sentences": emitted.get(r_idx, [])}
        if not entry["sentences"]:
            h_sents = [j for j, s in enumerate(per_sent) if rel.head in s]
            t_sents = [j for j, s in enumerate(per_sent) if rel.tail in s]
            if rel.head == rel.tail:
                entry["reason"] = "head and tail are the same entity"
            elif not h_sents:
                entry["reason"] = "head has no full (non-pronoun) mention"
            elif not t_sents:
                entry["reason"] = "tail has no full (non-pronoun) mention"
            elif r_idx in merged_into:
                other, sent = merged_into[r_idx]
                entry["reason"] = (f"its triple text equals that of relation {other}, written in sentence {sent} "
                                   "(entities sharing a mention)")
            elif evidence:
                entry["reason"] = ("no evidence sentence names one entity with the other in it or its pretext "
                                   "(`evidence=True`)")
            else:
                entry["reason"] = "head and tail mentions are never within the pretext window of each other"
        out.append(entry)
    return out

