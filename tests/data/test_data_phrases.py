"""Relations outside the label set: the synthetic world's phrase relations (`synth_world.PHRASE_RELATIONS`), held
out by relation, and the phrase-relation edits (`data_gen.edits.phrase_edits`)."""

import json

from data_gen.edits import phrase_edits
from data_gen.synth_world import HELDOUT_PHRASES, PHRASE_RELATIONS, TRAIN_PHRASES, World, phrase_id
from data_gen.synthetic import (edit_world, heldout_split, phrase_cloze_forms, phrase_triples, synthetic_rel_info)
from memllm_jax.protocol import Triple


def _phrase_labels(docs: list[dict]) -> dict[str, list[str]]:
    """relation id -> the sentences stating it, over `docs`' phrase-relation labels."""
    out: dict[str, list[str]] = {}
    for d in docs:
        for label in d["labels"]:
            if label["r"].startswith("phrase:"):
                out.setdefault(label["r"], []).extend(" ".join(d["sents"][i]) for i in label["evidence"])
    return out


def test_a_world_without_phrases_is_unchanged_and_phrases_only_add_facts():
    plain, with_phrases = World(3, 80), World(3, 80, phrases=TRAIN_PHRASES)
    assert not [pid for e in plain.ents.values() for pid in e.facts if pid.startswith("phrase:")]
    added = 0
    for key, ent in with_phrases.ents.items():
        assert {k: v for k, v in ent.facts.items() if not k.startswith("phrase:")} == plain.ents[key].facts
        added += sum(k.startswith("phrase:") for k in ent.facts)
    assert added > 20
    assert not [pid for e in with_phrases.ents.values() for pid in e.facts if pid in {phrase_id(p) for p in HELDOUT_PHRASES}]


def test_phrase_relations_are_held_out_by_relation_and_stated_with_their_phrase():
    train, heldout = heldout_split(300, 200, seed=1, phrases=True)
    seen, held = _phrase_labels(train), _phrase_labels(heldout)
    rel_info = synthetic_rel_info(phrases=True)
    heldout_ids = {phrase_id(p) for p in HELDOUT_PHRASES}
    assert seen and not heldout_ids & set(seen)  # no training document states a held-out relation
    assert heldout_ids & set(held) and set(seen) & set(held)  # the held-out world states both kinds
    for pid, sentences in {**seen, **held}.items():
        assert all(rel_info[pid] in s for s in sentences)  # the phrase is in the sentence the writer reads
    assert len(rel_info) == len(synthetic_rel_info()) + len(PHRASE_RELATIONS)
    assert heldout_split(300, 200, seed=1) == heldout_split(300, 200, seed=1, phrases=False)


def test_write_and_read_examples_name_the_phrase_as_the_relation(tmp_path):
    from data_gen.build import build_all
    from data_gen.recipes import ReadRecipe, WriteRecipe

    train, _ = heldout_split(200, 40, seed=2, phrases=True)
    corpus = tmp_path / "docs.json"
    corpus.write_text(json.dumps(train))
    build_all(str(corpus), str(tmp_path / "out"), synthetic_rel_info(phrases=True), kinds={"write", "read"},
              write=WriteRecipe(), read=ReadRecipe())
    written = [json.loads(line) for line in (tmp_path / "out" / "write.jsonl").open()]
    triples = {tuple(t) for r in written for t in r["triples"]}
    phrase_facts = [t for t in triples if t[1] in PHRASE_RELATIONS]
    assert phrase_facts and all(t[1] in TRAIN_PHRASES for t in phrase_facts)
    subject, phrase, obj = phrase_facts[0]
    assert any(f"{subject}>>{phrase}>>{obj}" in s["text"] for r in written for s in r["segments"] if s["loss"])
    reads = (tmp_path / "out" / "read.jsonl").read_text()
    assert any(f">>{p}>>" in reads for p in TRAIN_PHRASES)


def test_phrase_edits_are_one_per_subject_with_another_object_of_the_relation():
    world = edit_world(200, seed=4, phrases=True)
    held = phrase_triples(world, HELDOUT_PHRASES)
    assert held and {t.relation for t in held} <= HELDOUT_PHRASES
    records = phrase_edits(held, 500, seed=4, loc_triples=phrase_triples(world, PHRASE_RELATIONS))
    by_subject = {}
    for t in held:
        by_subject.setdefault(t.subject, []).append(t)
    assert 0 < len(records) == len({r.src for r in records}) <= len(by_subject)
    objects = {}
    for t in held:
        objects.setdefault(t.relation, set()).add(t.object)
    touched = set()
    for r in records:
        t = next(t for t in held if r.src == f"{t.subject}'s {t.relation} was ")
        assert r.rephrase == f"The {t.relation} of {t.subject} was " and r.alt in objects[t.relation] - {t.object}
        assert r.statement in {f.replace("{S's}", t.subject + "'s").replace("{S}", t.subject).replace("{O}", r.alt)
                               for f in phrase_cloze_forms(t.relation)}
        touched |= {t.subject, t.object, r.alt}
    assert not [r.loc for r in records if any(r.loc.startswith(name + "'s ") for name in touched)]
    assert phrase_edits(held, 3, seed=4) == phrase_edits(held, 3, seed=4) and len(phrase_edits(held, 3, seed=4)) == 3


def test_phrase_edits_of_hand_made_facts():
    facts = [Triple("Ann", "mentor", "Bo"), Triple("Cy", "mentor", "Di"), Triple("Ed", "mentor", "Fay"),
             Triple("Gus", "rival", "Hal")]
    records = phrase_edits(facts, 10, seed=0)
    assert [r.src for r in sorted(records, key=lambda r: r.src)] == ["Ann's mentor was ", "Cy's mentor was ",
                                                                       "Ed's mentor was "]
    ann = next(r for r in records if r.src.startswith("Ann"))
    assert ann.alt in {"Di", "Fay"} and ann.rephrase == "The mentor of Ann was "
    assert ann.statement in {f"Ann's mentor was {ann.alt}.", f"The mentor of Ann was {ann.alt}.",
                             f"{ann.alt} was Ann's mentor."}
    # Gus's rival has no other object of its relation: no edit; every record's locality question is about Gus
    assert {(r.loc, r.loc_ans) for r in records} == {("Gus's rival was ", "Hal")}


def test_data_synth_phrases_writes_their_labels_and_build_reads_them(tmp_path, capsys):
    from memllm_jax.cli import main

    corpus = tmp_path / "c" / "corpus.json"
    assert main(["data", "synth", "--out", str(corpus), "--docs", "60", "--seed", "1", "--phrases"]) == 0
    labels = json.loads((corpus.parent / "rel_info.json").read_text())
    assert labels == synthetic_rel_info(phrases=True)
    assert {lab["r"] for d in json.loads(corpus.read_text()) for lab in d["labels"]} & set(labels) - set(synthetic_rel_info())
    (corpus.parent / "rel_info.json").unlink()  # build finds the phrase labels in the bundled table
    assert main(["data", "build", "--input", str(corpus), "--out", str(tmp_path / "b"), "--kinds", "write"]) == 0
    assert any(f">>{p}>>" in (tmp_path / "b" / "write.jsonl").read_text() for p in PHRASE_RELATIONS)


def test_lone_phrase_examples_write_the_subject_first_whatever_the_order_of_the_names(tmp_path):
    from data_gen.build import build_all
    from data_gen.recipes import ReadRecipe, WriteRecipe

    train, _ = heldout_split(200, 40, seed=2, phrases=True)
    corpus = tmp_path / "docs.json"
    corpus.write_text(json.dumps(train))
    counts = {}
    for n in (0, 3):
        out = tmp_path / f"out{n}"
        build_all(str(corpus), str(out), synthetic_rel_info(phrases=True), kinds={"write"},
                  write=WriteRecipe(context_free=1, lone_phrases=n), read=ReadRecipe())
        lone = [json.loads(line) for line in (out / "write.jsonl").open() if '"context_free": true' in line]
        counts[n] = lone
    added = [r for r in counts[3] if r not in counts[0]]
    assert len(added) > 20 and len(counts[3]) == len(counts[0]) + len(added)
    reversed_form = 0
    for r in added:
        sentence = r["segments"][0]["text"]
        assert sentence.startswith("({USER_ST})")  # no pretext
        phrase_facts = [t for t in r["triples"] if t[1] in PHRASE_RELATIONS]
        assert phrase_facts
        subject, phrase, obj = phrase_facts[0]
        assert f"{subject}>>{phrase}>>{obj}" in r["segments"][1]["text"]
        reversed_form += sentence.index(obj) < sentence.index(subject)  # "Y was X's mentor."
    assert reversed_form > 5
