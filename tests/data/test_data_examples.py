"""Golden tests: write, read and eval examples of a hand-checked document (exact strings and loss flags)."""

import json

import pytest

from data_gen.recipes import ReadRecipe, WriteRecipe
from data_gen.docred import parse_document
from data_gen.eval_examples import eval_record
from data_gen.gold_memory import GoldLookup
from data_gen.read_examples import (absent_question_records, context_free_records, misread, question_form_records,
                                    read_records, scan_read_points)
from data_gen.relation_questions import GENERIC_TEMPLATES, QUESTIONS_BY_PID
from data_gen.relations import is_ambiguous
from memllm_jax.docred import DEFAULT_REL_INFO, load_relation_labels
from data_gen.write_examples import (DEFAULT_PRETEXT_SENTENCES, context_free_items, iter_write_items, question_form_items,
                                     taught_triples, write_coverage, write_record)
from memllm_jax import protocol as P

LABELS = {"P175": "performer", "P19": "place of birth", "P361": "part of", "P150": "contains administrative territorial entity",
          "P17": "country"}
RAW = {
    "title": "Alla Mia Età",
    "sents": [["Alla", "Mia", "Età", "is", "an", "album", "by", "Tiziano", "Ferro", "."],
              ["He", "was", "born", "in", "Latina", "."],
              ["The", "song", "Il", "Regalo", "Più", "Grande", "is", "part", "of", "Alla", "Mia", "Età", "."]],
    "vertexSet": [
        [{"name": "Alla Mia Età", "sent_id": 2, "pos": [9, 12], "type": "MISC"},
         {"name": "Alla Mia Età", "sent_id": 0, "pos": [0, 3], "type": "MISC"}],
        [{"name": "Tiziano Ferro", "sent_id": 0, "pos": [7, 9], "type": "PER"},
         {"name": "He", "sent_id": 1, "pos": [0, 1], "type": "PER"}],
        [{"name": "Latina", "sent_id": 1, "pos": [4, 5], "type": "LOC"}],
        [{"name": "Il Regalo Più Grande", "sent_id": 2, "pos": [2, 6], "type": "MISC"}],
    ],
    "labels": [{"h": 0, "t": 1, "r": "P175", "evidence": [0]}, {"h": 1, "t": 2, "r": "P19", "evidence": [1]},
               {"h": 3, "t": 0, "r": "P361", "evidence": [2]}, {"h": 3, "t": 1, "r": "P175", "evidence": [2]}],
}
TEXT = "Alla Mia Età is an album by Tiziano Ferro. He was born in Latina. The song Il Regalo Più Grande is part of Alla Mia Età."


def write_examples_of(doc, pretext_sentences=DEFAULT_PRETEXT_SENTENCES, evidence=False):
    return [write_record(doc, item) for item in iter_write_items(doc, pretext_sentences, evidence)]


def read_examples_of(doc, query_fn, **kwargs):
    return read_records(doc, scan_read_points(doc, query_fn, **kwargs))


@pytest.fixture
def doc():
    return parse_document(RAW, 0, LABELS, "golden.json")


def test_text_and_offsets(doc):
    assert doc.text == TEXT
    he = doc.entities[1].mentions[1]
    assert he.is_pronoun and he.text == "He" and TEXT[he.span[0]:he.span[1]] == "He"
    assert [TEXT[a:b] for a, b in doc.sentences][1] == "He was born in Latina."


def test_write_examples_golden(doc):
    recs = list(write_examples_of(doc))
    assert [r["segments"] for r in recs] == [
        [{"text": "({USER_ST})Alla Mia Età is an album by Tiziano Ferro.({USER_END})", "loss": False},
         {"text": "({MEM_WRITE-->Alla Mia Età>>performer>>Tiziano Ferro})", "loss": True}],
        [{"text": "Alla Mia Età is an album by Tiziano Ferro. ({USER_ST})He was born in Latina.({USER_END})", "loss": False},
         {"text": "({MEM_WRITE-->Tiziano Ferro>>place of birth>>Latina})", "loss": True}],
        [{"text": "Alla Mia Età is an album by Tiziano Ferro. He was born in Latina. "
                  "({USER_ST})The song Il Regalo Più Grande is part of Alla Mia Età.({USER_END})", "loss": False},
         {"text": "({MEM_WRITE-->Il Regalo Più Grande>>performer>>Tiziano Ferro;Alla Mia Età>>performer>>Tiziano Ferro;"
                  "Il Regalo Più Grande>>part of>>Alla Mia Età})", "loss": True}],
    ]
    assert all(r["eos"] for r in recs)
    assert all(c["sentences"] for c in write_coverage(doc))


def test_write_examples_with_evidence(doc):
    """`evidence=True`: a sentence's targets are the triples it is evidence for. Sentence 2 names the album and
    has Tiziano Ferro in its pretext, but the album's performer is stated (annotated evidence) in sentence 0 only."""
    calls = [r["segments"][1]["text"] for r in write_examples_of(doc, evidence=True)]
    assert calls == ["({MEM_WRITE-->Alla Mia Età>>performer>>Tiziano Ferro})",
                     "({MEM_WRITE-->Tiziano Ferro>>place of birth>>Latina})",
                     "({MEM_WRITE-->Il Regalo Più Grande>>performer>>Tiziano Ferro;"
                     "Il Regalo Più Grande>>part of>>Alla Mia Età})"]
    assert all(c["sentences"] for c in write_coverage(doc, evidence=True))
    # without annotations, a relation's evidence is the sentences naming both entities: the album's performer
    # stays in sentence 0; the song's performer is named with the song in no sentence, so nothing writes it
    raw = {**RAW, "labels": [{**lab, "evidence": []} for lab in RAW["labels"]]}
    bare = parse_document(raw, 0, LABELS, "golden.json")
    calls = [r["segments"][1]["text"] for r in write_examples_of(bare, evidence=True)]
    assert calls == ["({MEM_WRITE-->Alla Mia Età>>performer>>Tiziano Ferro})", "({MEM_WRITE-->})",
                     "({MEM_WRITE-->Il Regalo Più Grande>>part of>>Alla Mia Età})"]
    cov = write_coverage(bare, evidence=True)
    assert [c["sentences"] for c in cov] == [[0], [], [2], []]
    assert "evidence" in cov[3]["reason"]
    assert [r["segments"][1]["text"] for r in write_examples_of(bare)] == [
        r["segments"][1]["text"] for r in write_examples_of(doc)]  # the default ignores evidence


def test_taught_triples_score_as_the_ceiling_of_a_writer(doc):
    """`taught_triples`: the triples of the sentences' write examples. Counted by entity they are always right
    (gold relations under names the text gives); their recall is what the target rule leaves to learn: all four
    relations with annotated evidence, two of four when no sentence is annotated (the song's performer is named
    with the song in no sentence)."""
    from data_gen.gold_memory import entity_gold
    from memllm_jax.eval.write_quality import entity_agreement

    assert taught_triples([doc], evidence=True) == [t for r in write_examples_of(doc, evidence=True)
                                                    for t in map(lambda x: P.Triple(*x), r["triples"])]
    bare = parse_document({**RAW, "labels": [{**lab, "evidence": []} for lab in RAW["labels"]]}, 0, LABELS, "g.json")
    for d, recall in ((doc, 1.0), (bare, 0.5)):
        score = entity_agreement(taught_triples([d], evidence=True), [entity_gold(d)])
        assert score["precision"] == 1.0 and score["recall"] == recall
    assert len(taught_triples([doc, bare])) == 2 * len(taught_triples([doc]))  # without evidence: the same calls


def test_empty_write_and_pretext_window(doc):
    recs = list(write_examples_of(doc, pretext_sentences=0))
    # without a pretext the pronoun sentence has no full mention of Tiziano Ferro: the write is empty
    assert recs[1]["segments"][1]["text"] == "({MEM_WRITE-->})"
    assert recs[1]["segments"][0]["text"] == "({USER_ST})He was born in Latina.({USER_END})"
    cov = write_coverage(doc, pretext_sentences=0)
    assert cov[1]["sentences"] == [] and "pretext window" in cov[1]["reason"]


def test_context_free_items(doc):
    """A later sentence stating a triple between two names it holds, without its pretext; never the first
    sentence (already pretext-free) nor the pronoun sentence (no triple left without the pretext)."""
    items = context_free_items(doc, 5)
    assert [(i.sent_id, i.pretext, i.triples) for i in items] == [
        (2, "", (P.Triple("Il Regalo Più Grande", "part of", "Alla Mia Età"),))]
    assert context_free_items(doc, 0) == []


def _extra_write_records(tmp_path, flag: str, **build_kwargs) -> list[dict]:
    """The write records marked `flag` that `build_all(**build_kwargs)` adds to the golden document's; checks that
    it adds exactly one."""
    from data_gen import build

    path = tmp_path / "c.json"
    path.write_text(json.dumps([RAW]))
    plain = build.build_all(str(path), str(tmp_path / "plain"), LABELS, kinds={"write"})
    more = build.build_all(str(path), str(tmp_path / "more"), LABELS, kinds={"write"}, **build_kwargs)
    assert more.write_examples == plain.write_examples + 1
    recs = [json.loads(line) for line in (tmp_path / "more" / "write.jsonl").read_text().splitlines()]
    return [r for r in recs if r.get(flag)]


def test_build_adds_context_free_write_examples(tmp_path):
    extra = _extra_write_records(tmp_path, "context_free", write=WriteRecipe(context_free=1))
    assert len(extra) == 1 and extra[0]["segments"][0]["text"] == (
        "({USER_ST})The song Il Regalo Più Grande is part of Alla Mia Età.({USER_END})")
    assert extra[0]["triples"] == [["Il Regalo Più Grande", "part of", "Alla Mia Età"]]


def test_question_form_items(doc):
    """Each triple whose two names one sentence holds (the pronoun sentence has none), asked in one of its relation's
    questions (natural or spelling the label out) with the answer after the edit bridge; the same draw for the same
    seed; over seeds, both kinds of question are drawn."""
    items = question_form_items(doc, 5)
    pids = {r.label: r.pid for r in doc.relations}
    assert sorted(i.triples for i in items) == [(P.Triple("Alla Mia Età", "performer", "Tiziano Ferro"),),
                                                (P.Triple("Il Regalo Più Grande", "part of", "Alla Mia Età"),)]
    for item in items:
        (t,) = item.triples
        assert item.pretext == ""
        templates = GENERIC_TEMPLATES + QUESTIONS_BY_PID[pids[t.relation]]
        assert item.sentence in {q.format(relation=t.relation, subject=t.subject) + " It is or they are " + t.object
                                 for q in templates}
    assert question_form_items(doc, 5) == items and question_form_items(doc, 0) == []
    assert len(question_form_items(doc, 1)) == 1
    drawn = {i.sentence for seed in range(20) for i in question_form_items(doc, 5, seed)}
    assert "Who performed Alla Mia Età? It is or they are Tiziano Ferro" in drawn
    assert "What is the performer of Alla Mia Età? It is or they are Tiziano Ferro" in drawn


def test_relation_questions_cover_docred_relations():
    """A natural question for each of DocRED's 96 relations, each asking about {subject} only."""
    assert len(QUESTIONS_BY_PID) == 96 and all(p.startswith("P") for p in QUESTIONS_BY_PID)
    for questions in QUESTIONS_BY_PID.values():
        for q in questions:
            assert q.endswith("?") and q.format(subject="X") != q and "{relation}" not in q
    if DEFAULT_REL_INFO.is_file():
        assert set(QUESTIONS_BY_PID) == set(load_relation_labels())


def test_build_adds_question_form_write_examples(tmp_path):
    (extra,) = _extra_write_records(tmp_path, "question_form", write=WriteRecipe(question_form=1))
    (triple,) = extra["triples"]
    prompt = extra["segments"][0]["text"]
    assert prompt.startswith("({USER_ST})") and prompt.endswith(" It is or they are " + triple[2] + "({USER_END})")
    assert extra["segments"][1] == {"text": "({MEM_WRITE-->" + ">>".join(triple) + "})", "loss": True}


def test_question_form_read_records(doc):
    """A triple asked as a question, its subject and relation read, the document's objects as the result (no loss)
    and the object as the answer, then EOS."""
    recs = question_form_records(doc, 5)
    performer = next(r for r in recs if r["target"] == "Tiziano Ferro")
    question = performer["segments"][0]["text"]
    assert question in {q.format(relation="performer", subject="Alla Mia Età")
                        for q in GENERIC_TEMPLATES + QUESTIONS_BY_PID["P175"]}
    assert [(s["text"], s["loss"]) for s in performer["segments"]] == [
        (question, False), ("({MEM_READ(Alla Mia Età>>performer>>)-->", True), ("Tiziano Ferro})", False),
        (" Tiziano Ferro", True)]
    assert performer["eos"] and performer["question_form"] and performer["results"] == ["Tiziano Ferro"]
    assert len(recs) == 2 and question_form_records(doc, 0) == [] and question_form_records(doc, 5) == recs


def _extra_read_records(tmp_path, flag: str, count_field: str, **build_kwargs) -> list[dict]:
    """The read records marked `flag` that `build_all(**build_kwargs)` adds to the golden document's; checks that
    it adds exactly one and counts it in `Stats.<count_field>`."""
    from data_gen import build

    path = tmp_path / "c.json"
    path.write_text(json.dumps([RAW]))
    plain = build.build_all(str(path), str(tmp_path / "plain"), LABELS, kinds={"read"})
    more = build.build_all(str(path), str(tmp_path / "more"), LABELS, kinds={"read"}, **build_kwargs)
    assert (more.read_examples, getattr(more, count_field)) == (plain.read_examples + 1, 1)
    recs = [json.loads(line) for line in (tmp_path / "more" / "read.jsonl").read_text().splitlines()]
    return [r for r in recs if r.get(flag)]


def test_build_adds_question_form_read_examples(tmp_path):
    (extra,) = _extra_read_records(tmp_path, "question_form", "question_form_reads", read=ReadRecipe(question_form=1))
    assert extra["segments"][1]["text"].startswith("({MEM_READ(") and extra["eos"]


def test_absent_question_records(doc):
    """A question about a relation the document gives other entities of the type but not this one ("part of": the
    song has it, the album not), its read, the empty result (no loss) and the phrase as the answer, then EOS."""
    from memllm_jax.train.data import tokenize_records
    from tests.support.eval_fakes import CharTokenizer

    memory = GoldLookup().add_documents([doc])
    [rec] = absent_question_records(doc, 5, query_fn=memory)
    question = rec["segments"][0]["text"]
    assert question in {q.format(relation="part of", subject="Alla Mia Età")
                        for q in GENERIC_TEMPLATES + QUESTIONS_BY_PID["P361"]}
    assert [(s["text"], s["loss"]) for s in rec["segments"]] == [
        (question, False), ("({MEM_READ(Alla Mia Età>>part of>>)-->", True), ("})", False), (" unknown", True)]
    query = P.Query("Alla Mia Età", "part of", None)
    assert "".join(s["text"] for s in rec["segments"][1:3]) == P.format_empty_read([query])
    assert memory([query]) == [[]]  # the read returns nothing
    assert rec["eos"] and rec["absent"] and rec["results"] == [] and rec["target"] == P.ABSTAIN
    assert absent_question_records(doc, 5) == [rec] and absent_question_records(doc, 0) == []
    # the loss covers the call, the phrase and EOS; not the question nor the empty result
    tok = CharTokenizer()
    [ex] = tokenize_records([("test", rec)], tok)
    assert ex.ids[ex.loss].tolist() == tok.encode(rec["segments"][1]["text"] + " unknown") + [tok.eos_id]
    assert tok.decode(ex.ids[~ex.loss][-1:]) == P.CALL_END
    # a memory that answers the query (e.g. from another document), or finds too many, leaves no question
    assert absent_question_records(doc, 5, query_fn=lambda qs: [["Some Box Set"] for _ in qs]) == []
    assert absent_question_records(doc, 5, query_fn=lambda qs: [None for _ in qs]) == []


def test_build_adds_absent_question_read_examples(tmp_path):
    (extra,) = _extra_read_records(tmp_path, "absent", "absent_reads", read=ReadRecipe(absent_questions=1))
    assert extra["segments"][2] == {"text": P.CALL_END, "loss": False} and extra["eos"]


def test_context_free_read_records(doc):
    """The reads of a later sentence alone: the query names an entity of the sentence itself, the text before it is
    dropped, spans are the sentence's own, no EOS; the pronoun sentence ("He was born in Latina.") has no read
    without its pretext."""
    recs = context_free_records(doc, GoldLookup().add_documents([doc]), 5)
    assert [[(s["text"], s["loss"]) for s in r["segments"]] for r in recs] == [[
        ("The song Il Regalo Più Grande is part of", True), ("({MEM_READ(Il Regalo Più Grande>>part of>>)-->", True),
        ("Alla Mia Età})", False), (" Alla Mia Età.", True)]]
    rec = recs[0]
    assert (rec["sent_id"], rec["eos"], rec["context_free"]) == (2, False, True)
    sentence = "The song Il Regalo Più Grande is part of Alla Mia Età."
    assert sentence[slice(*rec["target_span"])] == rec["target"] == "Alla Mia Età"
    assert context_free_records(doc, None, 0) == []


def test_build_adds_context_free_read_examples(tmp_path):
    extra = _extra_read_records(tmp_path, "context_free", "context_free_reads", read=ReadRecipe(context_free=1))
    assert [r["sent_id"] for r in extra] == [2]


def test_read_examples_golden(doc):
    recs = list(read_examples_of(doc, GoldLookup().add_documents([doc])))
    seg = [[(s["text"], s["loss"]) for s in r["segments"]] for r in recs]
    # reads go before the space that precedes the target, so the text after a read starts with " Name"
    assert seg[0] == [("Alla Mia Età is an album by", True),
                      ("({MEM_READ(Alla Mia Età>>performer>>)-->", True), ("Tiziano Ferro})", False),
                      (" Tiziano Ferro. He was born in", True), ("({MEM_READ(", True)]
    assert seg[1] == [("Alla Mia Età is an album by Tiziano Ferro. He was born in", False),
                      ("({MEM_READ(Tiziano Ferro>>place of birth>>)-->", True), ("Latina})", False),
                      (" Latina. The song", True), ("({MEM_READ(", True)]
    assert seg[2] == [("Alla Mia Età is an album by Tiziano Ferro. He was born in Latina. The song", False),
                      ("({MEM_READ(>>part of>>Alla Mia Età;>>performer>>Tiziano Ferro)-->", True),
                      ("Il Regalo Più Grande;Alla Mia Età})", False),
                      (" Il Regalo Più Grande is part of Alla Mia Età.", True)]
    assert [r["eos"] for r in recs] == [False, False, True]
    assert recs[2]["result_counts"] == [1, 2]  # sorted by result count
    # each example without its calls is a prefix of the document, ending where the next read goes
    ends = [TEXT.index(" Latina"), TEXT.index(" Il Regalo"), len(TEXT)]
    for r, end in zip(recs, ends):
        assert P.strip_calls("".join(s["text"] for s in r["segments"] if s["text"] != P.MEM_READ)) == TEXT[:end]
    full = "".join(s["text"] for s in recs[0]["segments"][:1]) + "".join(
        r["segments"][3]["text"] for r in recs)
    assert full == TEXT


def test_misread_replaces_results_by_entities_named_before_the_read(doc, tmp_path):
    """Every result replaced (rate 1) by an entity the text named before the read that is no target, not in the
    query and not in the result; the first read has none (only its query's own entity precedes it) and keeps its
    result. Rate 0 changes nothing; the build counts the replacements and writes the replaced results."""
    from data_gen import build

    memory = GoldLookup().add_documents([doc])
    gold = scan_read_points(doc, memory)
    assert misread(doc, gold, 0.0) == 0 and gold == scan_read_points(doc, memory)
    points = scan_read_points(doc, memory)
    assert misread(doc, points, 1.0, seed=3) == 3
    assert [p.results for p in points] == [[["Tiziano Ferro"]], [["Alla Mia Età"]], [points[2].results[0], ["Latina"]]]
    assert points[2].results[0][0] in ("Latina", "Tiziano Ferro")
    recs = list(read_records(doc, points))
    assert recs[1]["results"] == ["Alla Mia Età"] and recs[1]["segments"][2]["text"] == "Alla Mia Età})"
    path = tmp_path / "c.json"
    path.write_text(json.dumps([RAW]))
    stats = build.build_all(str(path), str(tmp_path / "out"), LABELS, kinds={"read"}, read=ReadRecipe(misread_rate=1.0), seed=3)
    built = [json.loads(line) for line in (tmp_path / "out" / "read.jsonl").read_text().splitlines()]
    assert stats.misread_results == 3 and [r["results"] for r in built] == [r["results"] for r in recs]
    assert [r["misread"] for r in built] == [0, 1, 2]  # the first read has no wrong entity to take


def test_misread_counts_the_context_free_reads_too(tmp_path):
    """The build's count of replaced results includes the context-free read examples' (each record says how many
    of its results were replaced); with "by Ferro" after the last sentence, its lone read of Ferro has a wrong
    entity to take (Alla Mia Età or Il Regalo Più Grande, named before it in that sentence)."""
    import copy

    from data_gen import build

    raw = copy.deepcopy(RAW)
    raw["sents"][2][-1:] = ["by", "Ferro", "."]
    raw["vertexSet"][1].append({"name": "Ferro", "sent_id": 2, "pos": [13, 14], "type": "PER"})
    path = tmp_path / "c.json"
    path.write_text(json.dumps([raw]))
    stats = build.build_all(str(path), str(tmp_path / "out"), LABELS, kinds={"read"},
                            read=ReadRecipe(misread_rate=1.0, context_free=2), seed=3)
    built = [json.loads(line) for line in (tmp_path / "out" / "read.jsonl").read_text().splitlines()]
    lone = [r for r in built if r.get("context_free")]
    assert sum(r["misread"] for r in lone) > 0
    assert stats.misread_results == sum(r["misread"] for r in built)


def test_read_without_memory_falls_back_to_target_and_thresholds(doc):
    recs = list(read_examples_of(doc, lambda qs: [[] for _ in qs]))
    assert [r["results"] for r in recs] == [["Tiziano Ferro"], ["Latina"], ["Il Regalo Più Grande"]]
    # more than Q_thr results (or a memory's too_large) drops the query; a read with no query left disappears
    many = lambda qs: [[f"e{i}" for i in range(31)] if q.relation == "performer" else None for q in qs]  # noqa: E731
    pts = scan_read_points(doc, many)
    assert pts == [] or all(len(r) <= 30 for p in pts for r in p.results)
    assert pts == []


def test_ambiguous_filter_by_pid():
    assert is_ambiguous("P19", target_is_subject=True) and not is_ambiguous("P19", target_is_subject=False)
    assert is_ambiguous("P150", target_is_subject=False) and not is_ambiguous("P150", target_is_subject=True)


def test_ambiguous_query_dropped_in_scan():
    raw = {"title": "t", "sents": [["Ohio", "is", "in", "the", "United", "States", "."], ["Jo", "was", "born", "in", "Ohio", "."]],
           "vertexSet": [[{"name": "Ohio", "sent_id": 0, "pos": [0, 1]}, {"name": "Ohio", "sent_id": 1, "pos": [4, 5]}],
                         [{"name": "United States", "sent_id": 0, "pos": [4, 6]}], [{"name": "Jo", "sent_id": 1, "pos": [0, 1]}]],
           "labels": [{"h": 0, "t": 1, "r": "P17"}, {"h": 2, "t": 0, "r": "P19"}]}
    d = parse_document(raw, 0, LABELS)
    pts = scan_read_points(d, GoldLookup().add_documents([d]))
    # <Ohio, country, *> is kept (object query); <*, place of birth, Ohio> is Table 4's ambiguous pattern
    assert [p.queries for p in pts] == [[P.Query("Ohio", "country", None)]]
    assert pts[0].targets[0].text == "United States"
    assert [len(p.queries) for p in scan_read_points(d, None, filter_ambiguous=False)] == [1, 1]


def test_eval_record(doc):
    rec = eval_record(doc)
    assert rec["kind"] == "eval" and rec["text"] == TEXT
    assert [r["pos"] for r in rec["reads"]] == [TEXT.index(" Tiziano"), TEXT.index(" Latina"), TEXT.index(" Il Regalo")]
    assert rec["reads"][2]["queries"] == [[None, "part of", "Alla Mia Età"], [None, "performer", "Tiziano Ferro"]]
    t = rec["reads"][1]["targets"][0]
    assert TEXT[t["span"][0]:t["span"][1]] == t["name"] == "Latina"
    spans = [(m["span"], m["pronoun"]) for m in rec["entity_mentions"]]
    assert len(spans) == 6 and ([TEXT.index("He"), TEXT.index("He") + 2], True) in spans
    assert rec["triples"][0] == ["Alla Mia Età", "performer", "Tiziano Ferro"]


def test_eval_offsets_follow_escaping():
    raw = {"title": "t", "sents": [["a", "({", "b", "is", "in", "C", "."]],
           "vertexSet": [[{"name": "b", "sent_id": 0, "pos": [2, 3]}], [{"name": "C", "sent_id": 0, "pos": [5, 6]}]],
           "labels": [{"h": 0, "t": 1, "r": "P361"}]}
    d = parse_document(raw, 0, LABELS)
    rec = eval_record(d)
    assert P.ESC in rec["text"]
    t = rec["reads"][0]["targets"][0]
    assert rec["text"][t["span"][0]:t["span"][1]] == "C" and rec["reads"][0]["pos"] == t["span"][0] - 1  # the space


def test_writes_counted_by_entity_accept_any_name_of_the_gold_entity():
    """`entity_agreement`: a written name may be any full mention of the gold entity ("Ferro" for Tiziano Ferro,
    which counting by canonical name faults); a pronoun or a reversed relation is wrong; a gold relation written
    under two names is found once, and a fact two documents state is found in both."""
    import copy

    from data_gen.gold_memory import entity_gold, gold_triples
    from memllm_jax.eval.write_quality import entity_agreement, write_agreement

    raw = copy.deepcopy(RAW)
    raw["sents"][2][-1:] = ["by", "Ferro", "."]
    raw["vertexSet"][1].append({"name": "Ferro", "sent_id": 2, "pos": [13, 14], "type": "PER"})
    doc = parse_document(raw, 0, LABELS, "golden.json")
    gold = entity_gold(doc)
    assert gold.names[1] == {"tiziano ferro", "ferro"} and (3, "part of", 0) in gold.relations
    written = [P.Triple("Alla Mia Età", "performer", "Ferro"), {"subject": "alla mia  età", "relation": "Performer",
                                                                "object": "Tiziano Ferro", "source": "0:x/2"},
               P.Triple("He", "place of birth", "Latina"), P.Triple("Latina", "place of birth", "Tiziano Ferro")]
    by_entity = entity_agreement(written, [gold])
    assert by_entity["written_unique"] == 4 and by_entity["correct"] == 2
    assert by_entity["gold_relations"] == 4 and by_entity["gold_relations_found"] == 1
    assert by_entity["precision"] == pytest.approx(2 / 4) and by_entity["recall"] == pytest.approx(1 / 4)
    assert write_agreement(written[:1], gold_triples(doc))["correct"] == 0  # the canonical name is "Tiziano Ferro"
    other = entity_gold(parse_document(RAW, 1, LABELS, "golden.json"))  # names him "Tiziano Ferro" only
    assert entity_agreement(written[:1], [gold, other])["gold_relations_found"] == 1
    both = entity_agreement(written[1:2], [gold, other])
    assert both["gold_relations"] == 8 and both["gold_relations_found"] == 2 and both["correct"] == 1
    assert entity_agreement([], [gold])["f1"] == 0.0


def test_writes_grouped_by_how_often_their_relation_is_taught():
    """`agreement_by_relation_frequency`: relations ordered by their training targets split the gold triples into
    about equal groups (one relation never split, so ties stay together); each written triple counts in its
    relation's group, including relations no gold triple has."""
    from memllm_jax.eval.write_quality import agreement_by_relation_frequency

    T = P.Triple
    gold = ([T(f"a{i}", "rare", "x") for i in range(3)] + [T(f"b{i}", "Middle", "x") for i in range(3)]
            + [T(f"c{i}", "common", "x") for i in range(3)])
    written = [T("a0", "rare", "x"), T("b0", "middle", "x"), T("b1", "middle", "y"), T("c0", "common", "x"),
               T("c1", "common", "x"), T("c2", "common", "x"), T("d", "unseen", "x"), T("e", "also common", "x")]
    taught = {"rare": 2, "middle": 20, "common": 200, "also common": 500}
    groups = agreement_by_relation_frequency(written, gold, taught)
    assert [(g["taught_min"], g["taught_max"], g["relations"]) for g in groups] == [(0, 19, 1), (20, 199, 1), (200, None, 1)]
    assert [(g["gold_unique"], g["written_unique"], g["correct"]) for g in groups] == [(3, 2, 1), (3, 2, 1), (3, 4, 3)]
    assert groups[2]["recall"] == 1.0 and groups[0]["precision"] == 0.5
    # two relations taught equally often stay in one group, however the gold triples fall
    tied = agreement_by_relation_frequency(written, gold, {"rare": 5, "middle": 5, "common": 5})
    assert [(g["taught_min"], g["taught_max"], g["gold_unique"]) for g in tied] == [(0, None, 9)]


def test_absent_examples_as_cloze_sentence_starts():
    """`absent_form="cloze"`: a synthetic relation is asked as its corpus sentence start (no trailing space), as the
    synthetic Table 3 analogue asks; "question" keeps the natural questions, "mixed" gives both."""
    from data_gen.docred import documents_from_raw
    from data_gen.synthetic import cloze_templates, fill_cloze, iter_synthetic, synthetic_rel_info

    docs = list(documents_from_raw(list(iter_synthetic(6, seed=3)), synthetic_rel_info()))
    forms = cloze_templates()
    by_form = {form: [r for d in docs for r in absent_question_records(d, 4, form=form)]
               for form in ("question", "cloze", "mixed")}
    assert by_form["cloze"] and len(by_form["cloze"]) == len(by_form["question"])
    for rec in by_form["cloze"]:
        (subject, relation, _), prompt = rec["queries"][0], rec["segments"][0]["text"]
        if relation in forms:
            assert prompt in {fill_cloze(t, subject).rstrip() for t in forms[relation]}
        else:
            assert prompt.endswith("?")
    assert all(r["segments"][0]["text"].endswith("?") for r in by_form["question"])
    assert {r["segments"][0]["text"].endswith("?") for r in by_form["mixed"]} == {True, False}
