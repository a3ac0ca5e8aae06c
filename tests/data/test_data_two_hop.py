"""Two-hop questions and training examples from gold triples (`data_gen.two_hop`)."""

from memllm_jax import protocol
from memllm_jax.protocol import Triple
from data_gen import two_hop

T = Triple
WORLD = [T("Ann", "place of birth", "Vos"), T("Vos", "country", "Murestan"), T("Ann", "employer", "Kerek Group"),
         T("Kerek Group", "headquarters location", "Vos"), T("Ann", "child", "Bo"), T("Ann", "child", "Cy"),
         T("Bo", "place of birth", "Vos"), T("Ann", "spouse", "Di"), T("Di", "spouse", "Ann")]


def test_paths_have_one_answer_and_do_not_return_to_their_start():
    found = {(a.subject, a.relation, a.object, b.relation, b.object) for a, b in two_hop.paths(WORLD)}
    assert found == {("Ann", "place of birth", "Vos", "country", "Murestan"),
                     ("Ann", "employer", "Kerek Group", "headquarters location", "Vos"),
                     ("Bo", "place of birth", "Vos", "country", "Murestan"),
                     ("Kerek Group", "headquarters location", "Vos", "country", "Murestan"),
                     ("Di", "spouse", "Ann", "place of birth", "Vos"), ("Di", "spouse", "Ann", "employer", "Kerek Group")}
    # Ann has two children (no single answer); Di's spouse's spouse is Di herself


def test_questions_name_both_relations_one_per_start_and_pair_of_relations():
    qs = two_hop.two_hop_questions(WORLD + [T("Ann", "place of birth", "Vos")], 10)
    assert len(qs) == 6 and len({(q.subject, q.first, q.second) for q in qs}) == 6
    q = next(q for q in qs if q.subject == "Ann" and q.first == "place of birth")
    assert (q.middle, q.second, q.answer) == ("Vos", "country", "Murestan")
    assert "place of birth" in q.question and "country" in q.question and "Ann" in q.question
    assert two_hop.two_hop_questions(WORLD, 10, seed=0) == qs and len(two_hop.two_hop_questions(WORLD, 2)) == 2
    assert {q.question for seed in range(8) for q in two_hop.two_hop_questions(WORLD, 1, seed)} != {qs[0].question}


def test_training_records_are_the_two_contexts_the_reader_meets(tmp_path):
    """The first read's context (question, read, its result, the middle entity and the next read's opening, no EOS)
    and the second's (question and middle entity, the first read gone: the decoding core removes it)."""
    import json

    from data_gen.build import build_all
    from data_gen.recipes import ReadRecipe
    from data_gen.synthetic import iter_synthetic, synthetic_rel_info

    corpus = tmp_path / "docs.json"
    corpus.write_text(json.dumps(list(iter_synthetic(6, seed=3))))
    stats = build_all(str(corpus), str(tmp_path / "out"), synthetic_rel_info(), kinds={"read"},
                      read=ReadRecipe(two_hop=2))
    records = [json.loads(line) for line in (tmp_path / "out" / "read.jsonl").open()]
    firsts, seconds = ([r for r in records if r.get("two_hop") == k] for k in (1, 2))
    assert 0 < len(firsts) == len(seconds) == stats.two_hop_reads <= 12
    for one, two in zip(firsts, seconds):
        question, call1, result1, middle = one["segments"]
        asked, stated, call2, result2, answer = two["segments"]
        ((s1, r1, _),), ((s2, r2, _),) = one["queries"], two["queries"]
        assert [seg["loss"] for seg in one["segments"]] == [False, True, False, True] and not one["eos"]
        assert [seg["loss"] for seg in two["segments"]] == [False, False, True, False, True] and two["eos"]
        assert asked == question and r1 in question["text"] and r2 in question["text"] and s1 in question["text"]
        assert call1["text"] == protocol.format_read_call([protocol.Query(s1, r1, None)])
        assert result1["text"] == protocol.format_read_result([s2]) and one["target"] == s2
        assert middle["text"] == " " + s2 + protocol.MEM_READ and stated["text"] == " " + s2
        assert call2["text"] == protocol.format_read_call([protocol.Query(s2, r2, None)])
        assert result2["text"] == protocol.format_read_result([two["target"]]) and answer["text"] == " " + two["target"]
    plain = build_all(str(corpus), str(tmp_path / "plain"), synthetic_rel_info(), kinds={"read"}, read=ReadRecipe())
    assert plain.two_hop_reads == 0
    assert not [line for line in (tmp_path / "plain" / "read.jsonl").open() if '"two_hop"' in line]


def test_with_keep_reads_a_question_is_one_example_holding_both_reads():
    """A reader decoded with its reads kept meets the first read still in the context when it writes the second."""
    from data_gen.docred import documents_from_raw
    from data_gen.synthetic import iter_synthetic, synthetic_rel_info

    doc = next(d for d in documents_from_raw(list(iter_synthetic(6, seed=3)), synthetic_rel_info())
               if two_hop.paths(two_hop.gold_triples(d)))
    joined = two_hop.two_hop_records(doc, 2, keep_reads=True)
    split = two_hop.two_hop_records(doc, 2)
    assert joined and len(split) == 2 * len(joined)
    for one, (first, second) in zip(joined, zip(split[::2], split[1::2])):
        question, call1, result1, stated, call2, result2, answer = one["segments"]
        assert [s["loss"] for s in one["segments"]] == [False, True, False, True, True, False, True] and one["eos"]
        assert [question, call1, result1] == first["segments"][:3] and [call2, result2, answer] == second["segments"][2:]
        assert stated["text"] == second["segments"][1]["text"] and one["two_hop"] == 1
        assert one["target"] == second["target"] and one["queries"] == second["queries"]


def test_distractors_follow_the_right_entity_and_come_from_the_same_subject():
    import random

    rng = random.Random(0)
    drawn = [two_hop.with_distractors("Vos", "Ann", WORLD, 0.5, rng) for _ in range(200)]
    assert all(d[0] == "Vos" and 1 <= len(d) <= 3 and len(set(d)) == len(d) for d in drawn)
    assert {e for d in drawn for e in d[1:]} == {"Kerek Group", "Bo", "Cy", "Di"}  # Ann's other objects
    assert 0.35 < sum(len(d) > 1 for d in drawn) / 200 < 0.65
    assert two_hop.with_distractors("Vos", "Ann", WORLD, 0.0, rng) == ["Vos"]
    assert two_hop.with_distractors("Murestan", "Vos", WORLD, 1.0, rng) == ["Murestan"]  # Vos has no other object
