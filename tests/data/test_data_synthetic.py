"""Synthetic corpus: deterministic, DocRED-loadable, consistent world, pronouns, shared entities."""

import json
import subprocess
import sys

from data_gen.counterfactual import name_pools, permutation, replace_entities
from data_gen.docred import documents_from_raw, iter_documents
from data_gen.gold_memory import GoldLookup
from data_gen.read_examples import scan_read_points
from data_gen.synth_world import RELATIONS
from data_gen.synthetic import iter_synthetic, synthetic_rel_info


def test_deterministic_and_loadable():
    a = list(iter_synthetic(60, seed=3))
    b = list(iter_synthetic(60, seed=3))
    assert a == b and a != list(iter_synthetic(60, seed=4))
    docs = list(documents_from_raw(a, synthetic_rel_info()))
    assert 20 <= len(RELATIONS) <= 40
    assert any(m.is_pronoun for d in docs for e in d.entities for m in e.mentions)
    assert all(d.relations for d in docs)
    assert sum(len(d.sentences) for d in docs) / len(docs) >= 3


def test_world_is_consistent_across_documents():
    docs = list(documents_from_raw(iter_synthetic(400, seed=0), synthetic_rel_info()))
    facts: dict[tuple[str, str], set[str]] = {}
    single = {"P19", "P20", "P569", "P570", "P27", "P159", "P571", "P17", "P22", "P25", "P577"}
    names_per_doc = [set(e.name for e in d.entities if e.type == "PER") for d in docs]
    for d in docs:
        for r in d.relations:
            if r.pid in single:
                facts.setdefault((d.entities[r.head].name, r.pid), set()).add(d.entities[r.tail].name)
    assert facts and all(len(v) == 1 for v in facts.values())  # a functional fact never changes
    shared = sum(1 for i in range(1, len(docs)) if names_per_doc[i] & set().union(*names_per_doc[:i]))
    assert shared > len(docs) // 3  # people recur across documents


def test_memory_from_other_documents_answers_reads():
    docs = list(documents_from_raw(iter_synthetic(300, seed=1), synthetic_rel_info()))
    memory = GoldLookup().add_documents(docs[:200])  # facts written from earlier documents
    answered = total = 0
    for d in docs[200:]:
        for pt in scan_read_points(d, memory):
            total += 1
            answered += pt.targets[0].text in pt.merged_results
    assert total and answered / total > 0.2


def test_retllm_style():
    docs = list(documents_from_raw(iter_synthetic(20, seed=0, style="retllm"), synthetic_rel_info()))
    assert {r.pid for d in docs for r in d.relations} & {"P108", "P102", "P463"}


def test_cli_synth_and_build(tmp_path):
    out = tmp_path / "synth.json"
    env_cmd = [sys.executable, "-m", "memllm_jax.cli", "data"]
    r = subprocess.run(env_cmd + ["synth", "--out", str(out), "--docs", "50"], capture_output=True, text=True, check=True)
    assert "| documents | 50 |" in r.stdout and (tmp_path / "rel_info.json").exists()
    assert len(list(iter_documents(out, json.loads((tmp_path / "rel_info.json").read_text())))) == 50
    r = subprocess.run(env_cmd + ["build", "--input", str(out), "--out", str(tmp_path / "ex"), "--kinds", "write,read,eval,lm",
                                  "--counterfactual", "1", "--context-free", "1", "--format", "arrayrecord"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "triples per sentence" in r.stdout and "read points per document" in r.stdout
    import grain

    src = grain.sources.ArrayRecordDataSource(str(tmp_path / "ex" / "read.array_record"))
    recs = [json.loads(src[i]) for i in range(len(src))]
    assert recs and {r["kind"] for r in recs} == {"read"} and {r.get("variant") for r in recs} == {None, 0}
    writes = grain.sources.ArrayRecordDataSource(str(tmp_path / "ex" / "write.array_record"))
    assert any(json.loads(writes[i]).get("context_free") for i in range(len(writes)))


def test_counterfactual_consistent_replacement():
    raw = list(iter_synthetic(40, seed=2))
    pools = name_pools(raw)
    variants = [replace_entities(d, permutation(pools, 0, v)) for v in range(2) for d in raw]
    assert len(variants) == 80
    orig = list(documents_from_raw(raw, synthetic_rel_info()))
    cf = list(documents_from_raw(variants[:40], synthetic_rel_info()))
    mapping: dict[str, str] = {}
    for o, c in zip(orig, cf):
        assert [r.pid for r in o.relations] == [r.pid for r in c.relations]
        for eo, ec in zip(o.entities, c.entities):
            assert eo.type == ec.type
            assert mapping.setdefault(eo.name, ec.name) == ec.name  # consistent across the corpus
    assert sum(k != v for k, v in mapping.items()) == len(mapping)


def test_counterfactual_variants_of_chosen_kinds_only(tmp_path):
    """`WriteRecipe.counterfactual` adds the renamed documents' write examples and leaves every other kind as the
    build without variants makes it."""
    from data_gen.build import build_all
    from data_gen.recipes import WriteRecipe

    corpus = tmp_path / "synth.json"
    corpus.write_text(json.dumps(list(iter_synthetic(30, seed=5))))
    labels = synthetic_rel_info()
    plain = build_all(str(corpus), str(tmp_path / "plain"), labels, kinds={"write", "read", "lm"},
                      write=WriteRecipe(context_free=1), seed=0)
    build_all(str(corpus), str(tmp_path / "cf"), labels, kinds={"write", "read", "lm"},
              write=WriteRecipe(context_free=1, counterfactual=2), seed=0)
    for kind in ("read", "lm"):
        assert (tmp_path / "cf" / f"{kind}.jsonl").read_bytes() == (tmp_path / "plain" / f"{kind}.jsonl").read_bytes()
    read = lambda path: [json.loads(line) for line in path.read_text().splitlines()]  # noqa: E731
    plain_writes, writes = read(tmp_path / "plain" / "write.jsonl"), read(tmp_path / "cf" / "write.jsonl")
    assert [w for w in writes if "variant" not in w] == plain_writes
    for v in (0, 1):
        variant = [w for w in writes if w.get("variant") == v]
        assert len(variant) == plain.write_examples  # every example again, renamed
        assert [len(w["triples"]) for w in variant] == [len(w["triples"]) for w in plain_writes]
        assert sum(w["triples"] != p["triples"] for w, p in zip(variant, plain_writes)) > len(plain_writes) // 3
