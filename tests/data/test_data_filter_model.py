"""`memllm data filter --model DIR` end to end: a tiny random Mistral saved as an HF directory with a trained
tokenizer, a synthetic DocRED-format corpus, and the real command path (load_hf + generate_with_memory).

A random model answers garbage; the test checks the pipeline (one decision per candidate, the reports, the
filtered corpus agreeing with the decisions), not accuracy.
"""

import dataclasses
import json

import pytest
from flax import nnx

from data_gen import distant_filter as DF
from data_gen.docred import PRONOUNS
from memllm_jax import protocol
from memllm_jax.cli import main
from memllm_jax.config import TINY
from memllm_jax.model.hf import save_hf
from memllm_jax.model.decoder import Decoder
from memllm_jax.tokenizer import train_tokenizer

N_PER_CLASS = 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("filter_model")
    corpus = root / "corpus.json"
    assert main(["data", "synth", "--out", str(corpus), "--docs", "3", "--seed", "0"]) == 0
    docs = json.loads(corpus.read_text())
    model_dir = root / "model"
    texts = [DF.FIGURE5_SHOTS] + [" ".join(" ".join(s) for s in d["sents"]) for d in docs]
    tok = train_tokenizer([protocol.escape_text(t) for t in texts], 512, model_dir)
    # The 8-shot prompt is ~3.3k tokens with this tokenizer: the model's positions must cover it.
    cfg = dataclasses.replace(TINY, vocab_size=tok.vocab_size, max_seq_len=4096)
    save_hf(Decoder(cfg, rngs=nnx.Rngs(0)), model_dir)
    return root, corpus, docs, model_dir


@pytest.mark.slow
def test_filter_with_a_model_end_to_end(setup, capsys):
    root, corpus, docs, model_dir = setup
    base = ["data", "filter", "--input", str(corpus), "--score", str(N_PER_CLASS)]
    assert main(base + ["--prompts", str(root / "prompts.jsonl")]) == 0
    exported = [json.loads(line) for line in (root / "prompts.jsonl").read_text().splitlines()]
    assert len(exported) == 2 * N_PER_CLASS
    capsys.readouterr()

    out, dec = root / "filtered.json", root / "decisions.jsonl"
    assert main(base + ["--model", str(model_dir), "--max-new-tokens", "12", "--out", str(out),
                        "--decisions", str(dec)]) == 0
    stdout = capsys.readouterr().out

    # One decision per candidate, in the exported prompts' order, consistent with its completion.
    records = [json.loads(line) for line in dec.read_text().splitlines()]
    assert [(r["doc"], r["relation"], r["sent_id"], r["gold"]) for r in records] == \
        [(p["doc"], p["relation"], p["sent_id"], p["gold"]) for p in exported]
    for r in records:
        assert r["decision"] in ("yes", "no", "unparsed") and isinstance(r["completion"], str)
        assert r["decision"] == DF.decision(DF.parse_answer(r["completion"]))
    assert any(r["completion"].strip() for r in records), "the model generated nothing at all"
    assert not {r["head"].lower() for r in records} & PRONOUNS and not {r["tail"].lower() for r in records} & PRONOUNS
    assert sorted(r["gold"] for r in records) == [False] * N_PER_CLASS + [True] * N_PER_CLASS

    # The statistics report and Table 1's score row, matching the decisions.
    counts = {k: sum(r["decision"] == k for r in records) for k in ("yes", "no", "unparsed")}
    assert "| candidates | 4 |" in stdout and "| gold yes / no / unannotated | 2 / 2 / 0 |" in stdout
    assert f"| decisions yes / no / unparsed | {counts['yes']} / {counts['no']} / {counts['unparsed']} |" in stdout
    s = DF.score([{"yes": True, "no": False, "unparsed": None}[r["decision"]] for r in records],
                 [r["gold"] for r in records])
    assert "| precision | recall | F1 | accuracy | n | unparsed |" in stdout
    assert (f"| {s['precision']:.3f} | {s['recall']:.3f} | {s['f1']:.3f} | {s['accuracy']:.3f} | 4 | "
            f"{counts['unparsed']} |") in stdout

    # The filtered corpus: judged relations kept only with a Yes (evidence = the Yes sentences), others as they were.
    filtered = json.loads(out.read_text())
    assert len(filtered) == len(docs)
    for i, (d, f) in enumerate(zip(docs, filtered)):
        expected = []
        for r_i, lab in enumerate(d["labels"]):
            mine = [r for r in records if (r["doc"], r["relation"]) == (i, r_i)]
            yes = sorted({r["sent_id"] for r in mine if r["decision"] == "yes"})
            if not mine:
                expected.append(lab)
            elif yes:
                expected.append({**lab, "evidence": yes})
        assert f["labels"] == expected
        assert f["sents"] == d["sents"] and f["vertexSet"] == d["vertexSet"]


def test_prompt_longer_than_the_model_positions_is_a_clear_error(setup, tmp_path, capsys):
    root, corpus, _, model_dir = setup
    assert main(["data", "filter", "--input", str(corpus), "--score", "1", "--model", str(model_dir),
                 "--max-new-tokens", "4000", "--decisions", str(tmp_path / "d.jsonl")]) == 2
    assert "max_position_embeddings 4096" in capsys.readouterr().err
    assert not (tmp_path / "d.jsonl").exists()


def test_candidates_name_entities_not_pronouns():
    doc = {"sents": [["Ann", "Lee", "left", "."], ["She", "was", "born", "in", "Oslo", "."]],
           "vertexSet": [[{"name": "Ann Lee", "sent_id": 0}, {"name": "She", "sent_id": 1}], [{"name": "Oslo", "sent_id": 1}]],
           "labels": [{"h": 0, "t": 1, "r": "P19", "evidence": [0, 1]}]}
    (c,) = DF.candidates(doc, 0, {"P19": "place of birth"})
    assert (c.sent_id, c.head, c.tail, c.gold) == (1, "Ann Lee", "Oslo", True)
    only_pronoun = {**doc, "vertexSet": [[{"name": "She", "sent_id": 1}], doc["vertexSet"][1]]}
    (c,) = DF.candidates(only_pronoun, 0, {"P19": "place of birth"})
    assert c.head == "She"  # no full mention anywhere: the pronoun is all there is
