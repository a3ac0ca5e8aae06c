"""Synthetic knowledge-editing records (the embedded default's Table 3 analogue) from held-out gold triples."""

from __future__ import annotations

import random
from typing import Iterable, Mapping, Sequence

from data_gen.synthetic import cloze_templates, fill_cloze, phrase_cloze_forms
from memllm_jax.eval.abstention import AbsentQuestion
from memllm_jax.eval.editing import EditRecord
from memllm_jax.protocol import Triple


def synthetic_edits(gold: Iterable[Triple], n: int, seed: int = 0,
                    object_kinds: Mapping[str, str] | None = None) -> list[EditRecord]:
    """Cloze-style edit records from held-out gold `Triple`s (see memllm_jax/eval/editing.py): the question is the
    start of one of the corpus's sentences for the triple's relation, the rephrase the start of another one,
    the new answer another object seen with the same relation, the locality question the start of a
    sentence about a fact of an entity no edit names. Only relations with at least two sentence forms are edited.

    `object_kinds` (entity name -> type, e.g. "LOC"): at most one edit per subject and kind of answer. Without
    it, one per subject and relation, and the edits can contradict each other: the corpus says "S lies in A"
    (located in) and "S is a city in B" (country) alike, and "S was a citizen of" and "S is from" name two
    relations, so a second edit of S in the same kind leaves two rival answers to one question. With it, too, a
    person named by one edit between two people (spouse, sibling, parent, child) is named by no other such edit:
    the write model stores the inverse of those facts as well ("A's spouse was B" also writes B>>spouse>>A), so
    "A's spouse was B" followed by "C's spouse was A" would replace the first edit's answer."""
    forms = {rel: ts for rel, ts in cloze_templates().items() if len(ts) >= 2}
    triples = sorted({t for t in gold if t.relation in forms})
    rng = random.Random(seed)
    rng.shuffle(triples)
    by_rel: dict[str, list[str]] = {}
    for t in triples:
        by_rel.setdefault(t.relation, []).append(t.object)

    def edit_key(t: Triple) -> tuple[str, str]:
        return (t.subject, object_kinds.get(t.object, t.relation) if object_kinds is not None else t.relation)

    def between_people(*names: str) -> bool:
        return object_kinds is not None and all(object_kinds.get(x) == "PER" for x in names)

    chosen: list[tuple] = []  # (triple, first form, second form, new object)
    used: set[tuple[str, str]] = set()
    linked: set[str] = set()  # people named by an edit between two people
    for t in triples:
        if len(chosen) >= n:
            break
        alts = sorted({o for o in by_rel[t.relation] if o != t.object})
        if between_people(t.subject, t.object):
            alts = [o for o in alts if o not in linked and o != t.subject] if t.subject not in linked else []
        if not alts or edit_key(t) in used:
            continue
        used.add(edit_key(t))
        first, second = rng.sample(forms[t.relation], 2)
        alt = rng.choice(alts)
        if between_people(t.subject, alt):
            linked.update((t.subject, alt))
        chosen.append((t, first, second, alt))
    # Locality questions ask about facts no edit touches: about an entity that no edit names (as its subject,
    # old or new object), so that after every edit is written the unedited answer is still the right one. An
    # edit "A's spouse was B" changes B's facts too: the write model also stores B>>spouse>>A.
    touched = {name for t, *_, alt in chosen for name in (t.subject, t.object, alt)}
    edited_keys = {(t.subject, t.relation) for t, *_ in chosen}
    loc_pool = ([t for t in triples if t.subject not in touched]
                or [t for t in triples if (t.subject, t.relation) not in edited_keys])
    records = []
    for k, (t, first, second, alt) in enumerate(chosen):
        loc = loc_pool[(k * 7919) % len(loc_pool)] if loc_pool else t
        records.append(EditRecord(fill_cloze(first, t.subject), fill_cloze(second, t.subject), alt,
                                  fill_cloze(rng.choice(forms[loc.relation]), loc.subject), loc.object,
                                  statement=fill_cloze(first, t.subject, alt)))
    return records


def absent_questions(gold: Iterable[Triple], records: Sequence[EditRecord], n: int,
                     seed: int = 0) -> list[AbsentQuestion]:
    """Up to `n` cloze questions (as `synthetic_edits` asks them) about facts of `gold` that the memory of the
    `records`' edits does not hold: their subject is named by no edit sentence (`EditRecord.statement`), so no
    triple the memory-write model extracts from the edits is about it. One question per subject and relation."""
    if n <= 0:
        return []
    forms = cloze_templates()
    triples = sorted({t for t in gold if t.relation in forms and not any(t.subject in r.statement for r in records)})
    rng = random.Random(f"absent:{seed}")
    rng.shuffle(triples)
    asked: dict[tuple[str, str], AbsentQuestion] = {}
    for t in triples:
        if len(asked) >= n:
            break
        if (t.subject, t.relation) not in asked:
            question = fill_cloze(rng.choice(forms[t.relation]), t.subject)
            asked[t.subject, t.relation] = AbsentQuestion(question, t.object)
    return list(asked.values())


def phrase_edits(triples: Iterable[Triple], n: int, seed: int = 0,
                 loc_triples: Iterable[Triple] = ()) -> list[EditRecord]:
    """Up to `n` cloze edit records (as `synthetic_edits`) of phrase-relation facts (`synth_world.PHRASE_RELATIONS`),
    one per subject: the statement is one of the corpus's forms for the phrase with another object of the same
    relation ("The biographer of X was Y."), the question "X's biographer was", the rephrase "The biographer of X
    was", the locality question the same cloze about a fact of `loc_triples` (or `triples`) whose subject no edit
    names."""
    triples = sorted(set(triples))
    rng = random.Random(f"phrases:{seed}")
    rng.shuffle(triples)
    objects: dict[str, set[str]] = {}
    for t in triples:
        objects.setdefault(t.relation, set()).add(t.object)
    chosen: list[tuple[Triple, str]] = []
    subjects: set[str] = set()
    for t in triples:
        alts = sorted(objects[t.relation] - {t.object, t.subject})
        if len(chosen) >= n or t.subject in subjects or not alts:
            continue
        subjects.add(t.subject)
        chosen.append((t, rng.choice(alts)))
    touched = {name for t, alt in chosen for name in (t.subject, t.object, alt)}
    loc_pool = sorted(set(loc_triples) | set(triples))
    loc_pool = [t for t in loc_pool if t.subject not in touched] or [t for t, _ in chosen]
    records = []
    for k, (t, alt) in enumerate(chosen):
        forms, loc = phrase_cloze_forms(t.relation), loc_pool[(k * 7919) % len(loc_pool)]
        records.append(EditRecord(fill_cloze(forms[0], t.subject), fill_cloze(forms[1], t.subject), alt,
                                  fill_cloze(phrase_cloze_forms(loc.relation)[0], loc.subject), loc.object,
                                  statement=fill_cloze(rng.choice(forms), t.subject, alt)))
    return records
