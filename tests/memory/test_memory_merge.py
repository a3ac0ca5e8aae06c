"""Bulk memory writes in shards: `memllm memory write --process-index I --process-count N` writes the documents
k with k % N == I into its own directory, and `memllm memory merge OUT SHARD...` joins the shards into exactly
the memory one process writes: the same triples with the same provenance, in the same order (so the same
ids, seq and name tables), and the same progress file. With a scripted write model (real triples, some
written from several documents) and with a real tiny random model in two simultaneous processes."""

import dataclasses
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import time

import pytest

from memllm_jax import protocol
from memllm_jax.cli import main
from tests.support.scripted import CharTokenizer, PolicyModel
from memllm_jax.memory import HashEncoder, TripleMemory
from memllm_jax.memory.merge import merge

from tests.support.train_fixtures import CITIES, NAMES

TOK = CharTokenizer()
ENC = ["--encoder", "hash:16"]


def _facts(sentence: str) -> list[str]:
    if m := re.fullmatch(r"(.+) was born in (.+)\.", sentence):
        return [f"{m[1]}>>place of birth>>{m[2]}", f"{m[2]}>>birthplace of>>{m[1]}"]
    if m := re.fullmatch(r"(.+) visited (.+) in \d+\.", sentence):
        return [f"{m[1]}>>visited>>{m[2]}"]
    return []


def fact_policy(ctx):
    """Writes the facts of the focus sentence (`_facts`), then closes the call."""
    st, end, mw = (TOK.marker_id[m] for m in (protocol.USER_ST, protocol.USER_END, protocol.MEM_WRITE))
    if mw not in ctx:
        return [TOK.eos_id]
    target = ";".join(_facts(TOK.decode(ctx[ctx.index(st) + 1: ctx.index(end)])))
    body = TOK.decode(ctx[ctx.index(mw) + 1:])
    if body == target:
        return [TOK.marker_id[protocol.CALL_END], TOK.eos_id]
    if target.startswith(body):
        return TOK.encode(target[len(body)])
    return [TOK.eos_id]


def _corpus(path: pathlib.Path, n: int = 9) -> pathlib.Path:
    rng = random.Random(0)

    def sentence():
        a, c = rng.choice(NAMES[:3]), rng.choice(CITIES[:3])  # few names: many triples repeat across documents
        return f"{a} was born in {c}." if rng.random() < 0.5 else f"{a} visited {c} in {1900 + rng.randrange(9)}."

    records = [{"id": f"d{k}", "sentences": [sentence() for _ in range(rng.randrange(1, 4))]} for k in range(n)]
    records[4] = {"title": "AC/DC", "text": " ".join(records[3]["sentences"])}  # a copy of document 3; '/' in its id
    records[6] = {"id": "empty", "sentences": []}
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _open(d: pathlib.Path) -> TripleMemory:
    return TripleMemory.open(d, HashEncoder(16))


def _same_memory(a: pathlib.Path, b: pathlib.Path) -> None:
    """Equal as the memory one process writes: every triple with its provenance and seq, in insertion order;
    the same name tables (ids); the same progress."""
    ma, mb = _open(a), _open(b)
    assert ma.records() == mb.records()
    assert ma.entities.names == mb.entities.names and ma.relations.names == mb.relations.names
    pa, pb = (json.loads((d / "write_progress.json").read_text()) for d in (a, b))
    assert pa == pb


@pytest.mark.slow
def test_sharded_writes_merge_into_the_single_process_memory(tmp_path, monkeypatch, capsys):
    import memllm_jax.model.load as load

    monkeypatch.setattr(load, "load", lambda path, **kw: (PolicyModel(fact_policy, TOK.vocab_size), TOK))
    corpus = _corpus(tmp_path / "c.jsonl")
    write = ["memory", "write", "--model", "scripted", "--corpus", str(corpus), "--batch-size", "3", *ENC]
    assert main([*write, "--memory", str(tmp_path / "one")]) == 0
    stats_one = json.loads(capsys.readouterr().out.splitlines()[-1])
    one = _open(tmp_path / "one")
    records = one.records()
    assert stats_one["triples"] > len(records) > 5  # triples written from several documents, stored once
    sources = [r["source"] for r in records]
    assert any(x.startswith("3:d3/") for x in sources) and not any(x.startswith("4:") for x in sources)

    for n in (2, 3):
        shards = [tmp_path / f"n{n}.shard{i}" for i in range(n)]
        stats = []
        for i, d in enumerate(shards):
            assert main([*write, "--memory", str(d), "--process-index", str(i), "--process-count", str(n)]) == 0
            stats.append(json.loads(capsys.readouterr().out.splitlines()[-1]))
            progress = json.loads((d / "write_progress.json").read_text())
            assert progress["shard"] == [i, n] and progress["total"] == len(progress["done"])
            assert sorted(int(doc.split(":")[0]) for doc in progress["done"]) == list(range(i, 9, n))
        for key in ("documents", "sentences", "triples", "malformed", "no_cut", "tokens"):
            assert sum(s[key] for s in stats) == stats_one[key], key
        # documents 3 and 4 (a copy) are in different shards: 4's holds their triples under 4:AC/DC/..., the merge
        # keeps 3:d3/... as one process does
        assert 3 % n != 4 % n and any(r["source"].startswith("4:AC/DC/") for r in _open(shards[4 % n]).records())
        out = tmp_path / f"n{n}.merged"
        assert main(["memory", "merge", str(out), *map(str, reversed(shards))]) == 0  # any argument order
        summary = json.loads(capsys.readouterr().out.splitlines()[-1])
        assert summary["triples"] == len(records) and summary["duplicates"] > 0
        _same_memory(out, tmp_path / "one")
    # the merged memory is complete: writing the corpus into it again finds nothing to do
    assert main([*write, "--memory", str(tmp_path / "n2.merged")]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["sentences"] == 0


def test_merge_refuses_an_incomplete_or_mixed_set_of_shards(tmp_path, monkeypatch, capsys):
    import memllm_jax.model.load as load

    monkeypatch.setattr(load, "load", lambda path, **kw: (PolicyModel(fact_policy, TOK.vocab_size), TOK))
    corpus = _corpus(tmp_path / "c.jsonl")
    write = ["memory", "write", "--model", "scripted", "--corpus", str(corpus), *ENC]
    for i in range(2):
        shard = ["--memory", str(tmp_path / f"s{i}"), "--process-index", str(i), "--process-count", "2"]
        assert main([*write, *shard]) == 0
    # resuming a shard directory as another shard
    assert main([*write, "--memory", str(tmp_path / "s0"), "--process-index", "1", "--process-count", "2"]) == 2
    err = capsys.readouterr().err
    assert "s0/write_progress.json: field shard: progress belongs to shard 0 of 2, not 1 of 2" in err
    assert main(["memory", "merge", str(tmp_path / "m"), str(tmp_path / "s0"), str(tmp_path / "s0")]) == 2
    assert "field shard: shard 0 of 2 again" in capsys.readouterr().err
    progress = json.loads((tmp_path / "s1" / "write_progress.json").read_text())
    (tmp_path / "s1" / "write_progress.json").write_text(json.dumps({**progress, "done": progress["done"][:1]}))
    assert main(["memory", "merge", str(tmp_path / "m"), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 2
    assert f"s1: shard 1 of 2 has written 1 of its {progress['total']} documents" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    both = [str(tmp_path / "s0"), str(tmp_path / "s1")]
    assert main(["memory", "merge", str(tmp_path / "m"), *both, "--allow-partial"]) == 0
    assert main(["memory", "merge", str(tmp_path / "m"), *both]) == 2
    assert "m: a memory already exists there" in capsys.readouterr().err


def test_plain_merge_is_the_union_in_order():
    a, b = TripleMemory(HashEncoder(16)), TripleMemory(HashEncoder(16))
    T = protocol.Triple
    a.add([T("Ann", "born in", "Ulm"), T("Bob", "born in", "Rome")], source="a")
    b.add([T("Bob", "born in", "Rome"), T("Cy", "likes", "Ann")], source="b")
    both = TripleMemory(HashEncoder(16))
    both.add([T("Ann", "born in", "Ulm"), T("Bob", "born in", "Rome")], source="a")
    both.add([T("Bob", "born in", "Rome"), T("Cy", "likes", "Ann")], source="b")
    merged = merge([a, b])
    assert merged.records() == both.records() and merged.entities.names == both.entities.names
    assert merged.query([protocol.Query("Cy", "likes", None)])[0].entities == ["Ann"]
    with pytest.raises(ValueError, match="encoder"):
        merge([a, TripleMemory(HashEncoder(8))])


def _launch(argvs: list[list[str]], timeout: float = 300) -> list[str]:
    """Simultaneous processes, always reaped; their stdout (asserting exit status 0)."""
    env = {**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).parents[2]), "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen(a, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for a in argvs]
    deadline = time.monotonic() + timeout
    try:
        outs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode(errors="replace")[-3000:]
    return [out.decode() for out, _ in outs]


@pytest.mark.slow
def test_real_model_shards_in_two_processes(tmp_path, capsys):
    """A tiny random-weight model (it writes malformed calls, so few or no triples: what is compared is what is
    written) as two simultaneous `python -m memllm_jax.cli memory write` processes, merged == one process."""
    from flax import nnx

    from memllm_jax.checkpoint import save_params
    from memllm_jax.config import TINY
    from memllm_jax.model.decoder import Decoder
    from tests.support.train_fixtures import make_tokenizer

    tok = make_tokenizer(tmp_path / "tok")
    save_params(tmp_path / "model", 0, Decoder(dataclasses.replace(TINY, vocab_size=tok.vocab_size), rngs=nnx.Rngs(0)),
                tokenizer=str(tmp_path / "tok"))
    corpus = _corpus(tmp_path / "c.jsonl")
    write = ["memory", "write", "--model", str(tmp_path / "model"), "--corpus", str(corpus), "--batch-size", "4",
             "--max-new-tokens", "16", *ENC]
    outs = _launch([[sys.executable, "-m", "memllm_jax.cli", *write, "--memory", str(tmp_path / f"s{i}"),
                     "--process-index", str(i), "--process-count", "2"] for i in range(2)])
    assert main([*write, "--memory", str(tmp_path / "one")]) == 0
    stats_one = json.loads(capsys.readouterr().out.splitlines()[-1])
    stats = [json.loads(o.splitlines()[-1]) for o in outs]
    for key in ("documents", "sentences", "tokens", "malformed", "no_cut"):  # decoding is batch-invariant
        assert sum(s[key] for s in stats) == stats_one[key], key
    assert stats_one["sentences"] > 10
    assert main(["memory", "merge", str(tmp_path / "merged"), str(tmp_path / "s0"), str(tmp_path / "s1")]) == 0
    _same_memory(tmp_path / "merged", tmp_path / "one")
