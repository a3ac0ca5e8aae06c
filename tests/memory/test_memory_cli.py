"""`memllm memory ...` end to end on a hash-encoded memory."""

import json

from memllm_jax.cli import main


def test_memory_cli_round_trip(tmp_path, capsys):
    d = tmp_path / "mem"
    assert main(["memory", "create", str(d), "--encoder", "hash:64"]) == 0
    src = tmp_path / "in.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in [
        {"subject": "Ann", "relation": "works for", "object": "BMW", "source": "wiki"},
        {"subject": "Bob", "relation": "works for", "object": "BMW"},
    ]) + "\n")
    assert main(["memory", "import", str(d), str(src)]) == 0
    assert main(["memory", "add", str(d), "Ann>>lives in>>Ulm", "--source", "doc7"]) == 0
    capsys.readouterr()
    assert main(["memory", "query", str(d), "Ann>>works for>>", ">>works for>>BMW", "Ann>>>>"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert lines[0]["entities"] == ["BMW"] and lines[1]["entities"] == ["Ann", "Bob"]
    assert [t[:3] for t in lines[2]["triples"]] == [["Ann", "works for", "BMW"], ["Ann", "lives in", "Ulm"]]
    assert main(["memory", "add", str(d), "Ann>>works for>>Audi", "--replace"]) == 0
    assert main(["memory", "delete", str(d), "--entity", "Bob"]) == 0
    capsys.readouterr()
    assert main(["memory", "show", str(d), "Ann"]) == 0
    assert sorted(capsys.readouterr().out.splitlines()) == ["Ann>>lives in>>Ulm", "Ann>>works for>>Audi"]
    assert main(["memory", "stats", str(d)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["triples"] == 2 and stats["entities"] == 4 and stats["records_per_triple"] == 3.0  # BMW stays a record
    out = tmp_path / "out.jsonl"
    assert main(["memory", "export", str(d), str(out)]) == 0
    recs = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["object"], r["source"]) for r in recs] == [("Ulm", "doc7"), ("Audi", "cli")]


def test_memory_cli_errors(tmp_path, capsys):
    assert main(["memory", "stats", str(tmp_path)]) == 2
    assert "no CURRENT" in capsys.readouterr().err
    d = tmp_path / "mem"
    main(["memory", "create", str(d), "--encoder", "hash:8"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"subject": "a"}\n')
    assert main(["memory", "import", str(d), str(bad)]) == 2
    assert "bad.jsonl:1: field 'relation'" in capsys.readouterr().err
