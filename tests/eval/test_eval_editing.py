"""Table 3 scoring rule, prompt layout, and an end-to-end run with a tiny random model."""

import dataclasses

import pytest
from flax import nnx

from memllm_jax import protocol
from memllm_jax.config import TINY
from memllm_jax.eval import editing
from memllm_jax.eval.editing import (EditRecord, ZSRE_SHOTS, _score, build_prompt_ids, extract_answer, load_zsre,
                                     normalize_answer)
from memllm_jax.model.decoder import Decoder
from tests.support.eval_fakes import CharTokenizer


def test_normalisation_and_answer_extraction():
    assert normalize_answer("  The University of Michigan. ") == "university of michigan"
    assert extract_answer("\nA: Naples\nQ: next") == "Naples"
    assert extract_answer("") == ""


def test_scoring_rule():
    recs = [EditRecord("q1?", "r1?", "Naples", "l1?"), EditRecord("q2?", "r2?", "Rome", "l2?")]
    res = _score(recs, ["naples", "Milan"], ["The Naples", "rome"], ["x", "y"], ["x", "z"], [[], []], "sequential",
                 [False, True])
    assert (res.rel, res.gen, res.loc) == (0.5, 1.0, 0.5)
    assert res.avg == pytest.approx((0.5 + 1.0 + 0.5) / 3)
    assert (res.edits_in_memory, res.rel_in_memory, res.gen_in_memory) == (1, 0.0, 1.0)


def test_wrong_answers_are_counted_where_the_edit_was_lost():
    """Each wrong answer once, at the first stage that lost the edit's answer: no triple with it written, replaced
    in the memory and not returned, held but not returned by the read, returned and another answer given."""
    T = protocol.Triple
    recs = [EditRecord(f"q{k}?", "r?", "Naples", "l?") for k in range(6)]
    answers = ["naples", "Rome", "Rome", "Rome", "Rome", "Rome"]
    edits = [[T("A", "r", "Naples")], [T("A", "r", "Napoli")], [T("A", "r", "Naples")], [T("A", "r", "the Naples")],
             [T("A", "r", "Naples")], [T("A", "r", "Naples")]]
    reads = [("Naples",), ("Napoli",), ("Rome",), (), ("Rome", "naples"), ("Naples",)]
    held = [True, True, False, True, True, False]  # the last one: replaced by the same answer, and returned
    assert editing.error_kinds(recs, answers, reads, edits, held) == {"write": 1, "replaced": 1, "read": 1, "use": 2}
    res = _score(recs, answers, answers, [""] * 6, [""] * 6, edits, "sequential", held, reads, reads)
    assert res.errors_rel == res.errors_gen == {"write": 1, "replaced": 1, "read": 1, "use": 2}
    assert _score(recs, answers, answers, [""] * 6, [""] * 6, edits, "sequential", held).errors_rel == {}


def test_overwritten_later_counts_earlier_answers_of_a_subject():
    """An edit is overwritten when a later record about the same subject sets another answer; the same answer
    again (after normalisation), the last edit of a subject and records without a subject are not."""
    recs = [EditRecord("q", "r", "Rome", "l", subject="Ann"), EditRecord("q", "r", "Oslo", "l", subject="Ann"),
            EditRecord("q", "r", "the oslo", "l", subject="Ann"), EditRecord("q", "r", "Paris", "l", subject="Bob"),
            EditRecord("q", "r", "Acme", "l"), EditRecord("q", "r", "Kerek", "l")]
    assert editing.overwritten_later(recs) == [True, False, False, False, False, False]
    res = _score(recs, [""] * 6, [""] * 6, [""] * 6, [""] * 6, [[]] * 6, "sequential", [False] * 6)
    assert res.overwritten_later == 1
    assert _score(recs, [""] * 6, [""] * 6, [""] * 6, [""] * 6, [[]] * 6, "single", [False] * 6).overwritten_later == 0


def test_edits_in_memory_follow_replacement():
    """An edit counts as held only while a triple it wrote with the new object is stored: a later edit's triple
    with the same subject and relation replaces it, and an edit that wrote another object never counts."""
    from memllm_jax.memory import TripleMemory
    from memllm_jax.memory.encoder import load_encoder
    from memllm_jax.config import EDITING_MEMORY

    T = protocol.Triple
    recs = [EditRecord("Ann lives in ", "r", "Rome", "l"), EditRecord("Ann was born in ", "r", "Oslo", "l"),
            EditRecord("Bob lives in ", "r", "Paris", "l"), EditRecord("Cy works for ", "r", "Acme", "l")]
    edits = [[T("Ann", "residence", "Rome")],
             [T("Ann", "place of birth", "Oslo"), T("Ann", "residence", "Oslo")],  # extra triple replaces edit 0's
             [T("Bob", "residence", "the Paris")],  # "the" is dropped by the answer normalisation
             [T("Cy", "employer", "Acne")]]  # a copy error: not the new object
    mem = TripleMemory(load_encoder("hash:16"), EDITING_MEMORY)
    for k, triples in enumerate(edits):
        mem.add(triples, source=f"edit{k}", replace=True)
    assert editing.edits_in_memory(recs, mem.records()) == [False, True, True, False]


def test_prompt_has_one_full_read_shot_and_a_forced_read():
    tok = CharTokenizer()
    ids = build_prompt_ids(tok, ZSRE_SHOTS, "Where was Ann born?")
    mr, end = tok.marker_id[protocol.MEM_READ], tok.marker_id[protocol.CALL_END]
    assert ids[0] == tok.bos_id and ids[-1] == mr
    assert ids.count(mr) == 2 and ids.count(end) == 1  # the fifth shot's read, then the forced one
    text = tok.decode(ids)
    assert "Honolulu})" in text and text.endswith("Q: Where was Ann born?" + protocol.MEM_READ)
    assert protocol.WRITE_BRIDGE == " It is or they are "
    assert editing.edit_sentence(EditRecord("Where?", "r", "Naples", "l")) == "Where? It is or they are Naples"


def test_load_zsre(shared_data):
    recs = load_zsre(shared_data / "zsre" / "zsre_dev200.json", limit=5)
    assert len(recs) == 5 and all(r.loc.endswith("?") and not r.loc.startswith("nq question") for r in recs)
    recs = load_zsre(shared_data / "zsre" / "zsre_dev200.json")  # the same facts asked again with other answers
    assert (len(recs), len({r.subject for r in recs}), sum(editing.overwritten_later(recs))) == (198, 102, 71)


def test_load_zsre_bad_record(tmp_path):
    p = tmp_path / "z.json"
    p.write_text('[{"src": "a?", "rephrase": "b?", "alt": 5, "loc": "c"}]')
    with pytest.raises(ValueError, match="record 0.*alt"):
        load_zsre(p)
    p.write_text('[{"src": "a?", "rephrase": "b?", "alt": " ", "loc": "c"}, {"src": "d?", "rephrase": "e?", '
                 '"alt": "F", "loc": "g"}, {"src": "h?", "rephrase": "i?", "alt": "J", "loc": "k"}]')
    skipped = []
    recs = load_zsre(p, limit=1, skipped=skipped)
    assert [r.alt for r in recs] == ["F"] and skipped == [0]


@pytest.mark.slow
def test_end_to_end_without_edits_keeps_locality(monkeypatch):
    """With a write model that extracts nothing, the memory stays empty, so LOC must be exactly 1."""
    from memllm_jax.memory.encoder import load_encoder

    tok = CharTokenizer()
    model = Decoder(dataclasses.replace(TINY, vocab_size=128, max_seq_len=512), rngs=nnx.Rngs(0))
    monkeypatch.setattr(editing, "extract_edits", lambda *a, **k: [[] for _ in a[2]])
    recs = [EditRecord("Who?", "Who is it?", "Ann", "Where?"), EditRecord("What?", "What is it?", "Bob", "When?")]
    shots = (editing.Shot("A?", "B"), editing.Shot("C?", "D", (protocol.Query("C", "r", None),)))
    res = editing.evaluate_editing(model, model, tok, load_encoder("hash:16"), recs, shots=shots, max_new_tokens=4,
                                   batch_size=2)
    assert set(res) == {"sequential", "single"}
    for r in res.values():
        assert r.loc == 1.0 and r.written_triples == 0 and 0.0 <= r.rel <= 1.0


def test_cloze_prompt_and_answer():
    tok = CharTokenizer()
    ids = editing.build_cloze_prompt_ids(tok, "Ann worked for ")
    assert ids[0] == tok.bos_id and ids[-1] == tok.marker_id[protocol.MEM_READ]
    # the call follows the last word, as in the read model's training text: no lone trailing space before it
    assert tok.decode(ids[1:-1]) == "Ann worked for"
    assert editing.extract_cloze_answer(" Kerek Group. She was born") == "Kerek Group"
    assert editing.extract_cloze_answer("12 March 1956, in Rome") == "12 March 1956"
    assert editing.edit_sentence(EditRecord("Ann worked for ", "r", "Kerek", "l", statement="Ann worked for Kerek.")) \
        == "Ann worked for Kerek."
    with pytest.raises(ValueError, match="style"):
        editing.answer_questions(None, tok, None, ["q"], (), style="chat")


def test_synthetic_cloze_edits_come_from_the_corpus_templates():
    from data_gen.docred import load_documents
    from data_gen.gold_memory import gold_triples
    from data_gen.synthetic import cloze_templates, fill_cloze, iter_synthetic, synthetic_rel_info
    import json
    import pathlib
    import tempfile

    from data_gen.edits import synthetic_edits

    forms = cloze_templates()
    assert all("{O}" in t and t.startswith(("{S}", "{S's}")) and t.endswith("{O}.") for ts in forms.values() for t in ts)
    assert fill_cloze("{S's} spouse was {O}.", "Ann") == "Ann's spouse was "
    assert fill_cloze("{S} married {O}.", "Ann", "Bob") == "Ann married Bob."
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d) / "docs.json"
        path.write_text(json.dumps(list(iter_synthetic(30, seed=1))))
        docs = load_documents(str(path), synthetic_rel_info())
    records = synthetic_edits([t for d in docs for t in gold_triples(d)], 10)
    assert len(records) == 10
    for r in records:
        assert r.statement.startswith(r.src) and r.statement == r.src + r.alt + "."
        assert r.src != r.rephrase and r.loc_ans and r.alt
    # locality questions are about entities that no edit names (as its subject or its new object)
    gold = [t for d in docs for t in gold_triples(d)]
    subjects = sorted({t.subject for t in gold}, key=len, reverse=True)
    subject_of = lambda text: next(s for s in subjects if text.startswith(s))  # noqa: E731
    edited = {subject_of(r.src) for r in records} | {r.alt for r in records}
    assert edited and not {subject_of(r.loc) for r in records} & edited


def test_synthetic_edits_give_each_subject_at_most_one_edit_per_kind_of_answer():
    from data_gen.edits import synthetic_edits

    # "S lies in A" (located in) and "S is a city in B" (country) would be rival answers to one question
    T = protocol.Triple
    gold = [T("Bimar", "located in the administrative territorial entity", "Sheba Province"),
            T("Bimar", "country", "Gabuthia"), T("Neiprai", "country", "Digrelland"),
            T("Neiprai", "located in the administrative territorial entity", "Trokain Province"),
            T("Ann Vu", "employer", "Kerek Group"), T("Ann Vu", "country of citizenship", "Gabuthia"),
            T("Bo Vu", "employer", "Rome Inc"), T("Bo Vu", "country of citizenship", "Digrelland")]
    kinds = {"Sheba Province": "LOC", "Trokain Province": "LOC", "Gabuthia": "LOC", "Digrelland": "LOC",
             "Kerek Group": "ORG", "Rome Inc": "ORG"}
    subjects = ("Bimar", "Neiprai", "Ann Vu", "Bo Vu")
    for seed in range(5):
        records = synthetic_edits(gold, 10, seed=seed, object_kinds=kinds)
        keys = [(next(s for s in subjects if r.src.startswith(s)), kinds[r.alt]) for r in records]
        assert len(keys) == len(set(keys)) == 6  # Bimar and Neiprai once each, Ann Vu and Bo Vu twice each
    # without the kinds, one edit per subject and relation: both of Bimar's location facts can be edited
    assert len(synthetic_edits(gold, 10, seed=0)) == 8


def test_synthetic_edits_name_each_person_in_one_edit_between_people_at_most():
    from data_gen.edits import synthetic_edits

    # "Ann Vu's spouse was Cy Ra" then "Di Ra's spouse was Ann Vu": the second writes Ann Vu>>spouse>>Di Ra, which
    # replaces the first edit's answer, so REL would count the model wrong for reading the later edit
    T = protocol.Triple
    people = ["Ann Vu", "Bo Vu", "Cy Ra", "Di Ra", "Eve Lo", "Fay Lo", "Gus Lo", "Hal Lo"]
    gold = [T(a, "spouse", b) for a, b in zip(people, people[1:] + people[:1])]
    gold += [T(a, "employer", "Kerek Group") for a in people[:4]] + [T(a, "employer", "Rome Inc") for a in people[4:]]
    kinds = {**{p: "PER" for p in people}, "Kerek Group": "ORG", "Rome Inc": "ORG"}

    def people_named(records) -> list[str]:  # the people of each edit between two people
        return [p for r in records if r.alt in people for p in (next(p for p in people if r.src.startswith(p)), r.alt)]

    for seed in range(10):
        records = synthetic_edits(gold, 20, seed=seed, object_kinds=kinds)
        named = people_named(records)
        assert len(named) == len(set(named)) >= 4, (seed, named)
        assert sum(r.alt not in people for r in records) == 8  # the employer edits are not limited
    # without the kinds (a shared world) the rule is off: spouse edits share people
    assert any(len(set(named)) < len(named) for named in (people_named(synthetic_edits(gold, 20, seed=seed))
                                                          for seed in range(10)))


def test_synthetic_edits_ask_locality_questions_about_entities_no_edit_names():
    from data_gen.edits import synthetic_edits

    # "Ann Vu's spouse was Di Ra" makes the write model store Di Ra>>spouse>>Ann Vu too: Di Ra's facts changed
    T = protocol.Triple
    gold = [T("Ann Vu", "spouse", "Bo Vu"), T("Cy Ra", "spouse", "Di Ra"), T("Bo Vu", "employer", "Kerek Group"),
            T("Di Ra", "employer", "Rome Inc"), T("Eve Lo", "employer", "Kerek Group"), T("Fay Lo", "spouse", "Gus Lo")]
    names = sorted({n for t in gold for n in (t.subject, t.object)}, key=len, reverse=True)
    for seed in range(10):
        records = synthetic_edits(gold, 2, seed=seed)
        touched = {n for r in records for n in names if r.statement.startswith(n) or r.statement.endswith(n + ".")}
        touched |= {t.object for t in gold for r in records if r.src.startswith(t.subject)}
        assert all(not r.loc.startswith(tuple(touched)) for r in records), (seed, touched, [r.loc for r in records])


def test_answer_is_read_after_the_forced_call_that_opened_in_the_prompt():
    tok = CharTokenizer()
    prompt = editing.build_cloze_prompt_ids(tok, "Ann worked for ")
    generated = tok.encode("Ann>>employer>>" + protocol.READ_END + "Kerek Group" + protocol.CALL_END + " Kerek Group. She")
    after = editing._text_after(tok, prompt + generated, len(prompt), "Ann worked for ")
    assert editing.extract_cloze_answer(after) == "Kerek Group" and editing.answer_complete(after, "cloze")
    # a removed forced read (empty result) rewinds into the prompt: the answer is what follows the question
    rewound = prompt[:-1] + tok.encode(" Rome Inc. He")
    assert editing.extract_cloze_answer(editing._text_after(tok, rewound, len(prompt) - 1, "Ann worked for ")) == "Rome Inc"


@pytest.mark.parametrize("text, style, complete", [
    (" Kerek Group", "cloze", False), (" Kerek Group, then", "cloze", True), (" Kerek\n", "cloze", True),
    ("\nA: Paris", "qa", False), ("\nA:\n", "qa", False), ("\nA: Paris\n", "qa", True), (" Paris\n", "qa", True)])
def test_an_answer_is_complete_once_more_text_cannot_change_it(text, style, complete):
    extract = editing.extract_cloze_answer if style == "cloze" else editing.extract_answer
    assert editing.answer_complete(text, style) == complete
    if complete:  # whatever follows
        assert extract(text + " and more\nA: Rome.") == extract(text)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["cloze", "qa"])
def test_rows_stop_once_their_answer_is_complete_with_the_answers_of_the_whole_budget(style, monkeypatch):
    """A scripted reader asks, is answered, then writes the answer and goes on writing: `answer_questions`
    stops each row once its answer is complete (cloze: at the comma; QA: at the loop exit after the answer's
    line break), and extracts what generating to the end of the budget gives."""
    from memllm_jax.decode import reader
    from memllm_jax.config import EDITING_MEMORY
    from tests.support.scripted import PolicyModel
    from memllm_jax.eval.scoring import ModelWork
    from memllm_jax.memory import TripleMemory
    from memllm_jax.memory.encoder import load_encoder

    tok = CharTokenizer()
    mr, rend, cend = (tok.marker_id[m] for m in (protocol.MEM_READ, protocol.READ_END, protocol.CALL_END))
    tail = tok.encode(" Kerek Group, then Rome.\nA: Oslo\n" if style == "cloze" else "\nA: Kerek Group\n\nQ: Who? Rome\n")

    def policy(ctx):
        if mr not in ctx:  # the prompt
            return [tok.eos_id]
        k = len(ctx) - 1 - ctx[::-1].index(mr)
        gen = ctx[k + 1:]
        if cend not in gen:  # in the forced call: ask, then wait for the answer
            query = tok.encode("Ann>>employer>>") + [rend]
            return [query[len(gen)] if len(gen) < len(query) else tok.eos_id]
        after = gen[gen.index(cend) + 1:]
        return [tail[len(after) % len(tail)]]

    model = PolicyModel(policy, tok.vocab_size)
    mem = TripleMemory(load_encoder("hash:16"), EDITING_MEMORY)
    mem.add([protocol.Triple("Ann", "employer", "Kerek Group")], source="edit0", replace=True)
    questions = ["Ann worked for", "Where did Ann work?", "Ann was employed by"]
    shots = (editing.Shot("A?", "B"),)
    finished = []
    generate = reader.generate_with_memory

    def spy(*args, **kwargs):
        res = generate(*args, **kwargs)
        finished.extend((r.finish_reason, r.n_generated) for r in res)
        return res

    monkeypatch.setattr(reader, "generate_with_memory", spy)
    got = editing.answer_questions(model, tok, mem, questions, shots, max_new_tokens=60, batch_size=2, style=style)
    assert got == ["Kerek Group"] * 3
    assert [f for f, _ in finished] == ["done"] * 3 and all(n < 60 for _, n in finished)
    if style == "cloze":  # the query (16 tokens with `)-->`) and " Kerek Group," (13)
        assert [n for _, n in finished] == [29] * 3
        work = ModelWork()  # what ran through the model: the prompt, the generated tokens and the fed answer
        editing.ask_questions(model, tok, mem, questions[:1], shots, max_new_tokens=60, style=style, work=work)
        prompt = len(editing.build_cloze_prompt_ids(tok, questions[0]))
        fed = 29 + len(tok.encode(protocol.format_read_result(["Kerek Group"])))
        assert (work.decoded, work.positions, work.logits) == (29, prompt + fed, 1 + fed)
        assert work.attention_pairs == prompt * (prompt + 1) // 2 + fed * prompt + fed * (fed + 1) // 2
    assert [a.read_results for a in editing.ask_questions(model, tok, mem, questions[:1], shots, max_new_tokens=60,
                                                          style=style)] == [("Kerek Group",)]
    monkeypatch.setattr(editing, "answer_complete", lambda text, style: False)  # never done: the whole budget
    monkeypatch.setattr(editing, "clause_end_ids", lambda tok: [])
    finished.clear()
    assert editing.answer_questions(model, tok, mem, questions, shots, max_new_tokens=60, batch_size=2,
                                    style=style) == got
    assert [f for f, _ in finished] == ["budget"] * 3


def _cloze_reader(on_empty: str):
    """A scripted reader of cloze questions "<Name> worked for": its forced read asks <Name, employer, *>; it
    answers " <result>." after a result, `on_empty` after an empty result kept in its context, and " Rome Inc."
    when the read was removed (it answers from its "weights")."""
    from tests.support.scripted import PolicyModel

    tok = CharTokenizer()
    mr, rend, cend = (tok.marker_id[m] for m in (protocol.MEM_READ, protocol.READ_END, protocol.CALL_END))

    def policy(ctx):
        if mr not in ctx:
            plain = tok.decode(ctx[1:])
            if " worked for" not in plain:  # a prefix of the prompt
                return [tok.eos_id]
            text, after = " Rome Inc.", plain[plain.index(" worked for") + len(" worked for"):]
        else:
            k = len(ctx) - 1 - ctx[::-1].index(mr)
            gen = ctx[k + 1:]
            if rend not in gen:  # in the forced call: ask about the question's subject
                query = tok.encode(tok.decode(ctx[1:k]).split(" worked for")[0] + ">>employer>>") + [rend]
                return [query[len(gen)]]
            if cend not in gen:  # the memory answers here
                return [tok.eos_id]
            result, after = tok.decode(gen[gen.index(rend) + 1:gen.index(cend)]), tok.decode(gen[gen.index(cend) + 1:])
            text = f" {result}." if result else on_empty
        return tok.encode(text[len(after)]) if len(after) < len(text) else [tok.eos_id]

    return PolicyModel(policy, tok.vocab_size), tok


@pytest.mark.slow
@pytest.mark.parametrize("on_empty, keep_empty, abstained, named", [
    (" unknown.", True, 1.0, 0.0), (" Rome Inc.", True, 0.0, 1.0), (" unknown.", False, 0.0, 1.0)],
    ids=["abstains", "names_a_guess", "abstains_but_the_read_is_removed"])
def test_absent_facts_block(on_empty, keep_empty, abstained, named, monkeypatch):
    """Questions about facts the sequential memory does not hold: a reader that says "unknown" after an empty read
    abstains on all of them when the empty read stays in its context, and names a guess when it is removed (the
    paper's reading); a reader that names something names a guess. REL / GEN on the present fact stay 1."""
    from memllm_jax.eval.abstention import ABSENT_KEY, AbsentQuestion
    from memllm_jax.memory.encoder import load_encoder
    from experiments.tables import table3_markdown

    model, tok = _cloze_reader(on_empty)
    monkeypatch.setattr(editing, "extract_edits", lambda *a, **k: [[protocol.Triple("Ann", "employer", "Kerek Group")]])
    recs = [EditRecord("Ann worked for ", "Ann worked for ", "Kerek Group", "Bo worked for ",
                       statement="Ann worked for Kerek Group.")]
    absent = [AbsentQuestion("Cy worked for ", "Rome Inc"), AbsentQuestion("Di worked for ", "Oslo Ltd")]
    res = editing.evaluate_editing(model, model, tok, load_encoder("hash:16"), recs, regimes=("sequential",),
                                   style="cloze", max_new_tokens=40, batch_size=2, absent=absent,
                                   keep_empty=keep_empty)
    block = res[ABSENT_KEY]
    assert (block.abstention, block.named_guess, block.empty_reads) == (abstained, named, 1.0)
    assert block.correct_guess == (0.5 if named else 0.0)  # "Rome Inc" is Cy's employer all the same
    assert [e["answer"] for e in block.examples] == ["unknown" if abstained else "Rome Inc"] * 2
    assert (block.rel_present, block.gen_present) == (1.0, 1.0) == (res["sequential"].rel, res["sequential"].gen)
    md = table3_markdown({k: v.to_json() for k, v in res.items()})
    assert "**Absent facts** — 2 questions" in md
    assert f"| MemLLM (ours, sequential) | {abstained:.2f} | {named:.2f} |" in md
    assert ("kept in the context" in md) == keep_empty
    assert "absent" not in editing.evaluate_editing(model, model, tok, load_encoder("hash:16"), recs,
                                                    regimes=("sequential",), style="cloze", max_new_tokens=40)


def test_absent_questions_ask_about_subjects_no_edit_names():
    from data_gen.edits import absent_questions, synthetic_edits

    T = protocol.Triple
    people = ["Ann Vu", "Bo Vu", "Cy Ra", "Di Ra", "Eve Lo", "Fay Lo"]
    gold = [T(p, "employer", org) for p, org in zip(people, ["Kerek Group", "Rome Inc"] * 3)]
    gold += [T(p, "country of citizenship", c) for p, c in zip(people, ["Gabuthia", "Digrelland"] * 3)]
    records = synthetic_edits(gold, 2)
    questions = absent_questions(gold, records, 20)
    edited = {p for p in people if any(p in r.statement for r in records)}
    assert edited and questions and len(questions) == 2 * (len(people) - len(edited))
    for q in questions:
        subject = next(p for p in people if q.question.startswith(p))
        assert subject not in edited and T(subject, next(t.relation for t in gold if t.subject == subject
                                                         and t.object == q.answer), q.answer) in gold
    assert absent_questions(gold, records, 0) == [] and len(absent_questions(gold, records, 3)) == 3
