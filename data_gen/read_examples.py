"""Memory-read examples (paper §3.3, Algorithm 1 in Appendix C).

Scan the full (non-pronoun) entity mentions in text order. At mention m of entity E, every not yet seen
gold triple linking E to an entity e_q that was already mentioned becomes a query (<e_q, r, *> when E is
the object, <*, r, e_q> when E is the subject) and is marked seen. Queries matching Appendix B's ambiguous
patterns (Table 4, keyed by P-id) are dropped; the others are answered by `query_fn` (a TripleMemory or an
exact gold lookup), queries with more than Q_thr results are dropped, the rest are sorted by result count
and the first 3 kept. If none of them returns anything, the target itself is the result. The read goes
immediately before m.

Each read gives one example d' = pretext | read call | result | posttext, where the posttext runs up to
the next read of the document (followed by the "({MEM_READ(" that starts it) or to the end (then EOS).
Loss: the call and the posttext; the pretext only in the document's first example; never the result.

Context-free examples (`context_free_records`, optional): the reads of a later sentence of the document with
the text before it dropped (Algorithm 1 run on the lone sentence, so the query names an entity the sentence
itself names). Without them every read the model sees follows a document's opening, and a lone sentence start
such as an edit's cloze ("X studied at the") is a context it never read from: it asked the relations of a
biography's opening (place of birth) instead of the one the sentence states.

Question-form examples (`question_form_records`, optional; not in the paper's training data): one of the
document's triples asked as a natural question, the read of its subject and relation, the objects the document
states for them, then the answer, e.g. "Where was X born?({MEM_READ(X>>place of birth>>)-->Naples}) Naples".
Table 3 asks ZsRE questions with a read forced after the question mark; without them every read the model has
made followed a declarative sentence.

Absent-fact questions (`absent_question_records`, optional; not in the paper, whose Limitations say MemLLM is
not memory-aware): a question about a fact the memory does not hold, its read, the empty result and the phrase
`protocol.ABSTAIN` as the answer, e.g. "Where did X work?({MEM_READ(X>>employer>>)-->}) unknown", so that a model
read with `keep_empty` (the empty call kept in its context) says it does not know instead of naming something.

Imperfect results (`misread`, optional): the paper answers the training reads from the memory its trained
memory-write model wrote (§3.3: "We intentionally use this imperfect memory because it aligns the training data
with the ultimate inference conditions"), so the read model also sees results without the target and learns to
predict the text after them. Writing every training document with the memory-write model costs more than
training it on a CPU, so `misread` replaces each kept query's gold result, with a given probability, by one other
entity the text has named before the read: a writer's typical error (a pair of the document's entities that the
text does not relate).

A triple becomes "seen" when both its entities have been mentioned (whether or not its query survives the
filters). The pseudocode's line 18 read literally would mark triples seen before their query entity
appears, so no query could ever be formed; this follows the text of §3.3 and the original code instead.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Callable, Iterator, Sequence

from data_gen.docred import Document, Mention, sentence_document
from data_gen.relation_questions import ask
from data_gen.relations import is_ambiguous
from data_gen.synthetic import cloze_templates, fill_cloze
from data_gen.write_examples import asked_triples
from memllm_jax import protocol as P

QueryFn = Callable[[Sequence[P.Query]], Sequence["list[str] | None"]]
"""Answers a batch of queries; an entry is the result entity names, or None when the memory reports more
than its own threshold of matches (TripleMemory's `too_large`)."""

Q_THR = 30
MAX_QUERIES = 3


@dataclasses.dataclass
class ReadPoint:
    pos: int
    """Character offset of the read in `Document.text`: the start of the spaces before the target mention (or
    the mention's start when none precede it), so that the text after the read begins with " Name" and is
    tokenized as in the whole document by tokenizers that attach a space to the following word."""
    targets: list[Mention]
    queries: list[P.Query]
    """Kept queries, at most `max_queries`, in the order they appear in the call."""
    results: list[list[str]]
    """Per kept query, the memory's result (empty without a memory)."""
    candidates: int = 0
    """Queries formed before the ambiguity / Q_thr filters."""
    dropped_ambiguous: int = 0
    dropped_too_many: int = 0
    misread: int = 0
    """Of `results`: how many `misread` replaced by a wrong entity."""

    @property
    def merged_results(self) -> list[str]:
        out: list[str] = []
        for res in self.results:
            out.extend(e for e in res if e not in out)
        return out

    @property
    def call_results(self) -> list[str]:
        """What the memory returns in the example: the merged results, or the target when they are empty."""
        return self.merged_results or [self.targets[0].text]


def read_position(text: str, mention_start: int) -> int:
    """Where a read before the mention starting at `mention_start` goes: before the spaces that precede it."""
    pos = mention_start
    while pos > 0 and text[pos - 1] == " ":
        pos -= 1
    return pos


def scan_read_points(doc: Document, query_fn: QueryFn | None = None, q_thr: int = Q_THR,
                     max_queries: int = MAX_QUERIES, filter_ambiguous: bool = True) -> list[ReadPoint]:
    """Algorithm 1 for one document. Without `query_fn` every result is empty (gold positions/queries only)."""
    by_entity: dict[int, list[int]] = {}
    for r_idx, rel in enumerate(doc.relations):
        if rel.head != rel.tail:
            by_entity.setdefault(rel.head, []).append(r_idx)
            by_entity.setdefault(rel.tail, []).append(r_idx)
    mentions = [m for m in doc.mentions_in_order() if not m.is_pronoun]
    seen_entities: set[int] = set()
    last_mention: dict[int, Mention] = {}
    seen_triples: set[int] = set()
    pending: list[tuple[Mention, list[P.Query], int, int]] = []  # (target, queries, candidates, ambiguous)
    for m in mentions:
        queries: list[P.Query] = []
        n_cand = n_amb = 0
        for r_idx in by_entity.get(m.entity, ()):
            if r_idx in seen_triples:
                continue
            rel = doc.relations[r_idx]
            other = rel.tail if rel.head == m.entity else rel.head
            if other not in seen_entities:
                continue
            seen_triples.add(r_idx)
            target_is_subject = rel.head == m.entity
            name = last_mention[other].text
            q = P.Query(None, rel.label, name) if target_is_subject else P.Query(name, rel.label, None)
            n_cand += 1
            if filter_ambiguous and is_ambiguous(rel.pid, target_is_subject):
                n_amb += 1
                continue
            if q not in queries:
                queries.append(q)
        if n_cand:
            pending.append((m, queries, n_cand, n_amb))
        seen_entities.add(m.entity)
        last_mention[m.entity] = m

    all_queries = [q for _, qs, _, _ in pending for q in qs]
    answers = list(query_fn(all_queries)) if (query_fn is not None and all_queries) else [[] for _ in all_queries]
    if len(answers) != len(all_queries):
        raise ValueError(f"query_fn returned {len(answers)} results for {len(all_queries)} queries")
    points: list[ReadPoint] = []
    k = 0
    for m, qs, n_cand, n_amb in pending:
        scored = []
        too_many = 0
        for q in qs:
            res = answers[k]
            k += 1
            if res is None or len(res) > q_thr:
                too_many += 1
                continue
            scored.append((len(res), len(scored), q, list(res)))
        pos = read_position(doc.text, m.span[0])
        if points and points[-1].pos == pos:  # two entities' mentions start at the same character
            pt = points[-1]
            pt.targets.append(m)
            pt.candidates += n_cand
            pt.dropped_ambiguous += n_amb
            pt.dropped_too_many += too_many
            scored = sorted([(len(r), i, q, r) for i, (q, r) in enumerate(zip(pt.queries, pt.results))]
                            + [(n, i + 1000, q, r) for n, i, q, r in scored if q not in pt.queries])
            pt.queries = [s[2] for s in scored[:max_queries]]
            pt.results = [s[3] for s in scored[:max_queries]]
            continue
        if not scored:
            continue
        scored.sort(key=lambda s: (s[0], s[1]))
        points.append(ReadPoint(pos, [m], [s[2] for s in scored[:max_queries]], [s[3] for s in scored[:max_queries]],
                                n_cand, n_amb, too_many))
    return points


def misread(doc: Document, points: Sequence[ReadPoint], rate: float, seed: int = 0) -> int:
    """Replace, with probability `rate` (seeded by `seed` and the document id), each kept query's result of
    `points` by the name of one entity the text mentions before the read that is neither a target, nor named in the
    query, nor among that result (module docstring); a query with no such entity keeps its result. Returns the
    results replaced."""
    if rate <= 0:
        return 0
    rng = random.Random(f"{seed}:{doc.doc_id}:misread")
    mentions = [m for m in doc.mentions_in_order() if not m.is_pronoun]
    replaced = 0
    for pt in points:
        targets = {m.entity for m in pt.targets}
        names: dict[int, str] = {}  # each entity the text names before the read, by its first mention
        for m in mentions:
            if m.span[0] >= pt.pos:
                break
            names.setdefault(m.entity, m.text)
        for k, (query, result) in enumerate(zip(pt.queries, pt.results)):
            if rng.random() >= rate:
                continue
            others = sorted({n for e, n in names.items()
                             if e not in targets and n not in result and n not in (query.subject, query.object)})
            if others:
                pt.results[k] = [rng.choice(others)]
                pt.misread += 1
                replaced += 1
    return replaced


def read_records(doc: Document, points: Sequence[ReadPoint]) -> Iterator[dict]:
    """The training examples d' of one document (one per read point)."""
    text = doc.text
    for k, pt in enumerate(points):
        last = k == len(points) - 1
        end = len(text) if last else points[k + 1].pos
        segments = [
            {"text": P.escape_text(text[:pt.pos]), "loss": k == 0},
            {"text": P.format_read_call(pt.queries), "loss": True},
            {"text": P.format_read_result(pt.call_results), "loss": False},
            {"text": P.escape_text(text[pt.pos:end]), "loss": True},
        ]
        if not last:
            segments.append({"text": P.MEM_READ, "loss": True})
        yield {
            "kind": "read",
            "doc": doc.doc_id,
            "read_index": k,
            "segments": [s for s in segments if s["text"]],
            "eos": last,
            "target": pt.targets[0].text,
            "target_span": list(pt.targets[0].span),
            "queries": [[q.subject, q.relation, q.object] for q in pt.queries],
            "results": pt.call_results,
            "result_counts": [len(r) for r in pt.results],
            "misread": pt.misread,
        }


def context_free_records(doc: Document, query_fn: QueryFn | None, n: int, seed: int = 0, misread_rate: float = 0.0,
                         **kwargs) -> list[dict]:
    """The read examples of up to `n` sentences after the first, each alone (`sentence_document`), drawn at random
    (seeded by `seed` and the document id) among those with a read; marked `"context_free": true`, `sent_id` set.
    They end without EOS: the lone sentence is not the end of a document. `misread_rate`: see `misread`."""
    if n <= 0:
        return []
    sentences = [(i, sentence_document(doc, i)) for i in range(1, len(doc.sentences))]
    lone = [(i, sentence) for i, sentence in sentences if scan_read_points(sentence, None, **kwargs)]
    chosen = sorted(random.Random(f"{seed}:{doc.doc_id}").sample(lone, min(n, len(lone))), key=lambda c: c[0])
    out = []
    for i, sentence in chosen:
        points = scan_read_points(sentence, query_fn, **kwargs)
        misread(sentence, points, misread_rate, seed)
        out += [{**rec, "sent_id": i, "eos": False, "context_free": True} for rec in read_records(sentence, points)]
    return out


def question_form_records(doc: Document, n: int, seed: int = 0) -> list[dict]:
    """Up to `n` of the document's triples (`write_examples.asked_triples`, drawn apart from the question-form
    write examples), each as: the question (no loss), the read of its subject and relation, the objects the
    document states for them (no loss), " " + the triple's object, EOS. Marked `"question_form": true`."""
    out = []
    for a in asked_triples(doc, n, seed, salt="read-question"):
        query = P.Query(a.triple.subject, a.triple.relation, None)
        out.append({
            "kind": "read", "doc": doc.doc_id, "read_index": 0, "sent_id": a.sent_id, "question_form": True,
            "segments": [{"text": P.escape_text(a.question), "loss": False},
                         {"text": P.format_read_call([query]), "loss": True},
                         {"text": P.format_read_result(a.answers), "loss": False},
                         {"text": P.escape_text(" " + a.triple.object), "loss": True}],
            "eos": True, "target": a.triple.object, "queries": [[query.subject, query.relation, query.object]],
            "results": list(a.answers), "result_counts": [len(a.answers)],
        })
    return out


def absent_question_records(doc: Document, n: int, seed: int = 0, query_fn: QueryFn | None = None,
                            form: str = "question") -> list[dict]:
    """Up to `n` questions about facts the memory does not hold (drawn at random, seeded by `seed` and the document
    id): a relation that the document gives some entity of a type but not this entity of that type, and (with
    `query_fn`) that the memory does not answer for it either. Each as: the question (no loss), the read of the
    entity and relation, the empty result `})` (no loss), " " + `protocol.ABSTAIN`, EOS: the question-form
    examples' loss. Marked `"absent": true`. `form`: `ReadRecipe.absent_form` (a cloze is the synthetic corpus's
    sentence start for the relation, without its trailing space, as Table 3's cloze prompts)."""
    if n <= 0:
        return []
    given = {(rel.head, rel.label) for rel in doc.relations}
    typed: dict[tuple[str, str], set[str]] = {}  # (relation, P-id) -> the types of the entities the document gives it
    for rel in doc.relations:
        if rel.head != rel.tail:
            typed.setdefault((rel.label, rel.pid), set()).add(doc.entities[rel.head].type)
    pairs = sorted({(e.name, label, pid) for i, e in enumerate(doc.entities) for (label, pid), types in typed.items()
                    if e.type in types and (i, label) not in given})
    rng = random.Random(f"read-absent:{seed}:{doc.doc_id}")
    rng.shuffle(pairs)
    queries = [P.Query(name, label, None) for name, label, _ in pairs]
    if query_fn is not None and queries:
        found = list(query_fn(queries))
        pairs = [p for p, res in zip(pairs, found) if res is not None and not res]
    clozes = cloze_templates() if form != "question" else {}
    out = []
    for name, label, pid in pairs[:n]:
        query = P.Query(name, label, None)
        as_cloze = label in clozes and (form == "cloze" or rng.random() < 0.5)
        prompt = fill_cloze(rng.choice(clozes[label]), name).rstrip() if as_cloze else ask(name, label, pid, rng)
        out.append({
            "kind": "read", "doc": doc.doc_id, "read_index": 0, "absent": True,
            "segments": [{"text": P.escape_text(prompt), "loss": False},
                         {"text": P.format_read_call([query]), "loss": True},
                         {"text": P.format_read_result(()), "loss": False},
                         {"text": P.escape_text(" " + P.ABSTAIN), "loss": True}],
            "eos": True, "target": P.ABSTAIN, "queries": [[query.subject, query.relation, query.object]],
            "results": [], "result_counts": [0],
        })
    return out
