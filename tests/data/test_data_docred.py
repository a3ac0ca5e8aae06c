"""DocRED loader: validation errors name file / document / field; streaming; real Re-DocRED checks."""

import copy
import json
import time

import pytest

from data_gen import build
from data_gen.docred import DocumentError, iter_documents
from data_gen.io import iter_json_array
from memllm_jax.docred import detokenize, load_relation_labels

LABELS = {"P17": "country", "P131": "located in the administrative territorial entity"}
GOOD = {"title": "Tiny", "sents": [["Ohio", "is", "in", "the", "United", "States", "."]],
        "vertexSet": [[{"name": "Ohio", "sent_id": 0, "pos": [0, 1], "type": "LOC"}],
                      [{"name": "United States", "sent_id": 0, "pos": [4, 6], "type": "LOC"}]],
        "labels": [{"h": 0, "t": 1, "r": "P17", "evidence": [0]}]}


def test_detokenize_offsets():
    sents = [["He", "said", '"', "hi", '"', "(", "loud", ")", ",", "and", "Rihanna", "'s", "album", "."], ["Next", "."]]
    text, sent_spans, tok_spans = detokenize(sents)
    assert text == 'He said "hi" (loud), and Rihanna\'s album. Next.'
    for s, spans in zip(sents, tok_spans):
        assert [text[a:b] for a, b in spans] == s
    assert text[sent_spans[1][0]:sent_spans[1][1]] == "Next."


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d.pop("vertexSet"), "field vertexSet: missing"),
    (lambda d: d["vertexSet"][1][0].update(pos=[4, 9]), "field vertexSet[1][0].pos"),
    (lambda d: d["vertexSet"][0][0].update(sent_id=3), "field vertexSet[0][0].sent_id"),
    (lambda d: d["labels"][0].update(r="P999"), "field labels[0].r: unknown relation id 'P999'"),
    (lambda d: d["labels"][0].update(t=7), "field labels[0].t"),
    (lambda d: d["sents"].append([]), "field sents[1]"),
])
def test_malformed_document_errors_and_no_partial_output(tmp_path, mutate, field):
    bad = copy.deepcopy(GOOD)
    mutate(bad)
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps([GOOD, bad]))
    with pytest.raises(DocumentError) as err:
        list(iter_documents(path, LABELS))
    assert str(path) in str(err.value) and "document 1 (title 'Tiny')" in str(err.value) and field in str(err.value)
    out = tmp_path / "out"
    with pytest.raises(DocumentError):
        build.build_all(str(path), str(out), LABELS, kinds={"write", "read", "eval"})
    assert not out.exists() or list(out.iterdir()) == []  # no partial files


def test_json_array_streaming_small_chunks(tmp_path):
    docs = [dict(GOOD, title=f"d{i}") for i in range(50)]
    path = tmp_path / "c.json"
    path.write_text(json.dumps(docs, indent=2))
    assert [d["title"] for d in iter_json_array(path, chunk_chars=37)] == [f"d{i}" for i in range(50)]


def test_redocred_test_set(shared_data, tmp_path):
    path = shared_data / "redocred" / "test_revised.json"
    if not path.exists():
        pytest.skip("Re-DocRED test set absent")
    labels = load_relation_labels(shared_data / "docred" / "rel_info.json")
    raw = json.loads(path.read_text())
    docs = list(iter_documents(path, labels))
    assert len(docs) == len(raw) == 500
    for d, r in zip(docs, raw):  # every mention's offsets slice its tokens
        for ent, rent in zip(d.entities, r["vertexSet"]):
            for m in ent.mentions:
                toks = r["sents"][m.sent_id][m.pos[0]:m.pos[1]]
                assert d.text[m.span[0]:m.span[1]].replace(" ", "") == "".join(toks).replace(" ", "")
    t0 = time.perf_counter()
    stats = build.build_all(str(path), str(tmp_path / "ex"), labels, kinds={"write", "read", "eval"})
    assert time.perf_counter() - t0 < 60
    print("\n" + stats.report("Re-DocRED test"))
    # every gold relation is written somewhere or listed with its reason
    cov = [json.loads(line) for line in (tmp_path / "ex" / "coverage.jsonl").read_text().splitlines()]
    assert stats.gold_relations == sum(len(r["labels"]) for r in raw)
    assert len(cov) == sum(stats.relations_not_written.values()) and all(c["reason"] for c in cov)
    assert stats.gold_relations - len(cov) > 0.95 * stats.gold_relations
    assert stats.read_examples == sum(1 for _ in open(tmp_path / "ex" / "read.jsonl"))
    assert stats.eval_records == 500


def test_memllm_label_variant(shared_data):
    p = shared_data / "docred" / "rel_labels_memllm.json"
    if not p.exists():
        pytest.skip("label variants absent")
    labels = load_relation_labels(p)
    assert labels["P150"] == "contains administrative territorial entities" and len(labels) == 96
