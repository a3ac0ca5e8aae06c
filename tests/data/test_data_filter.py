"""Distant-supervision filter: Figure 5 prompt, answer parsing, Table 1 scoring, corpus filtering."""

import json
import subprocess
import sys

from data_gen import distant_filter as DF

LABELS = {"P19": "place of birth", "P17": "country"}
DOC = {"title": "t",
       "sents": [["Ann", "Lee", "lives", "in", "Oslo", "."], ["She", "was", "born", "in", "Oslo", ",", "Norway", "."],
                 ["Oslo", "is", "big", "."]],
       "vertexSet": [[{"name": "Ann Lee", "sent_id": 0, "pos": [0, 2]}],
                     [{"name": "Oslo", "sent_id": 0, "pos": [4, 5]}, {"name": "Oslo", "sent_id": 1, "pos": [4, 5]},
                      {"name": "Oslo", "sent_id": 2, "pos": [0, 1]}],
                     [{"name": "Norway", "sent_id": 1, "pos": [6, 7]}]],
       "labels": [{"h": 0, "t": 1, "r": "P19", "evidence": [1]}, {"h": 1, "t": 2, "r": "P17", "evidence": []}]}


def test_prompt_has_the_eight_shots_and_the_query():
    p = DF.build_prompt("Ctx .", "Main .", "Ann Lee", "place of birth", "Oslo")
    assert p.count("The answer is") == 8 and p.count("Main Sentence:") == 9
    assert p.startswith("To determine whether the main sentence contains information about the given relation")
    assert 'Relation: ("Osting", "date of birth", "April 7 , 1977")' in p
    assert p.endswith('Context: Ctx .\n\nMain Sentence: Main .\n\nRelation: ("Ann Lee", "place of birth", "Oslo")\n\nEvidence:')


def test_parse_answer():
    assert DF.parse_answer(" The relation indicates ... The answer is Yes.") is True
    assert DF.parse_answer("No evidence. The answer is no\n\nContext: ... The answer is Yes.") is False
    assert DF.parse_answer("hmm") is None and DF.parse_answer("") is None and DF.parse_answer(None) is None


def test_candidates_and_scoring():
    cands = DF.candidates(DOC, 0, LABELS)
    got = {(c.relation, c.sent_id, c.gold) for c in cands}
    assert got == {(0, 0, False), (0, 1, True), (0, 2, False), (1, 1, None), (1, 2, None)}
    c = next(c for c in cands if c.sent_id == 1 and c.relation == 0)
    assert c.context == "Ann Lee lives in Oslo ." and c.focus == "She was born in Oslo , Norway ." and c.head == "Ann Lee"
    s = DF.score([True, True, False, None], [True, False, True, False])
    assert (s["precision"], s["recall"], s["accuracy"], s["unparsed"]) == (0.5, 0.5, 0.5, 1)
    assert abs(s["f1"] - 0.5) < 1e-9


def _rule_model(prompts):
    """A generator that says Yes when the main sentence contains the word 'born' (deterministic stand-in)."""
    out = []
    for p in prompts:
        main = p.rsplit("Main Sentence:", 1)[1].split("\n")[0]
        out.append(" The relation ... The answer is " + ("Yes." if "born" in main else "No."))
    return out


def test_filter_documents_keeps_relations_with_evidence():
    out = DF.filter_documents([DOC], LABELS, _rule_model)[0]
    assert out["labels"] == [{"h": 0, "t": 1, "r": "P19", "evidence": [1]}, {"h": 1, "t": 2, "r": "P17", "evidence": [1]}]
    only = DF.filter_documents([DOC], LABELS, lambda ps: [" The answer is No."] * len(ps), only_missing_evidence=True)[0]
    assert only["labels"] == [DOC["labels"][0]]  # the annotated relation is untouched, the other judged No


def test_cli_prompts_answers_score(tmp_path):
    corpus = tmp_path / "c.json"
    corpus.write_text(json.dumps([DOC]))
    (tmp_path / "rel_info.json").write_text(json.dumps(LABELS))
    cmd = [sys.executable, "-m", "memllm_jax.cli", "data", "filter", "--input", str(corpus), "--score", "5"]
    subprocess.run(cmd + ["--prompts", str(tmp_path / "p.jsonl")], check=True, capture_output=True)
    prompts = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(prompts) == 3  # 1 positive + 2 negatives available
    with open(tmp_path / "a.jsonl", "w") as f:
        for c in _rule_model([p["prompt"] for p in prompts]):
            f.write(json.dumps({"completion": c}) + "\n")
    r = subprocess.run(cmd + ["--answers", str(tmp_path / "a.jsonl")], check=True, capture_output=True, text=True)
    assert "| 1.000 | 1.000 | 1.000 | 1.000 | 3 | 0 |" in r.stdout
