"""Bad input fails like a CLI: one line `error: <file>: ...` on stderr, exit 2, no traceback.

Each case is one row of the table in docs/errors.md (same id); `test_docs_table_lists_every_case` keeps the
two in step. Cases run `memllm_jax.cli.main` in-process; `test_subprocess_*` checks the real process once.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from memllm_jax.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _corpus(tmp: pathlib.Path, name: str = "c.json", docs: list | None = None) -> pathlib.Path:
    from data_gen.synthetic import iter_synthetic

    path = tmp / "in" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(list(iter_synthetic(3, seed=0)) if docs is None else docs))
    return path


def _docs() -> list[dict]:
    from data_gen.synthetic import iter_synthetic

    return list(iter_synthetic(3, seed=0))


def _write_bytes(tmp: pathlib.Path, name: str, data: bytes) -> pathlib.Path:
    path = tmp / "in" / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(data)
    return path


def _truncated(tmp: pathlib.Path, name: str = "c.json") -> pathlib.Path:
    text = json.dumps(_docs())
    return _write_bytes(tmp, name, text[: len(text) // 2].encode())


def _not_utf8(tmp: pathlib.Path, name: str = "c.json") -> pathlib.Path:
    data = json.dumps(_docs()).encode()
    cut = data.index(b'"title"', 10) + 10  # inside the second document's title
    return _write_bytes(tmp, name, data[:cut] + b"\xe9" + data[cut:])


def _build(path, *extra):
    return ["data", "build", "--input", str(path), "--out", str(path.parent.parent / "out"), *extra]


# ------------------------------------------------------------------------------------------ the cases
# id -> f(tmp, monkeypatch) returning (argv, text the one-line message must contain)


def data_missing_input(tmp, mp):
    return _build(tmp / "in" / "nope.json"), "nope.json: No such file or directory"


def data_truncated(tmp, mp):
    return _build(_truncated(tmp)), "c.json: element 1 (char"


def data_not_utf8(tmp, mp):
    p = _not_utf8(tmp)
    offset = p.read_bytes().index(b"\xe9")
    return _build(p), f"c.json: byte offset {offset}: not UTF-8 text"


def data_no_vertexset(tmp, mp):
    docs = _docs()
    del docs[1]["vertexSet"]
    return _build(_corpus(tmp, docs=docs)), "c.json: document 1 (title"


def data_bad_mention_span(tmp, mp):
    docs = _docs()
    docs[2]["vertexSet"][0][0]["pos"] = [5, 3]
    return _build(_corpus(tmp, docs=docs)), "field vertexSet[0][0].pos: [5, 3] is not a token span"


def data_empty_corpus(tmp, mp):
    return _build(_corpus(tmp, docs=[])), "c.json: no documents"


def data_unknown_relations_no_labels(tmp, mp):
    docs = _docs()
    docs[0]["labels"][0]["r"] = "P9999"
    return _build(_corpus(tmp, docs=docs)), "c.json: relation ids P9999 have no label here"


def data_labels_docred_absent(tmp, mp):
    import data_gen.cli

    mp.setattr(data_gen.cli, "DEFAULT_REL_INFO", tmp / "shared" / "rel_info.json")
    return _build(_corpus(tmp), "--labels", "docred"), "--labels docred: "


def data_labels_truncated(tmp, mp):
    labels = _write_bytes(tmp, "labels.json", b'{"P17": "coun')
    return _build(_corpus(tmp), "--labels", str(labels)), "labels.json: invalid JSON: Unterminated string starting at: line 1 column 9"


def data_jsonl_bad_line(tmp, mp):
    lines = [json.dumps(d) for d in _docs()]
    lines[1] = lines[1][:40]
    return _build(_write_bytes(tmp, "c.jsonl", "\n".join(lines).encode())), "c.jsonl: line 2: invalid JSON: Expecting value: column 1"


def data_synth_zero_docs(tmp, mp):
    return ["data", "synth", "--out", str(tmp / "s.json"), "--docs", "0"], "--docs 0: "


def data_filter_bad_answers(tmp, mp):
    corpus = _corpus(tmp)
    answers = _write_bytes(tmp, "answers.jsonl", b'{"completion": "yes"}\n[1, 2]\n')
    return (["data", "filter", "--input", str(corpus), "--answers", str(answers)],
            "answers.jsonl: record 2: expected an object")


def train_missing_config(tmp, mp):
    return ["train", "--config", str(tmp / "nope.py")], "nope.py: config file not found"


def train_unknown_config_name(tmp, mp):
    return ["train", "--config", "no_such_config"], "no_such_config: no such experiment config"


def train_bad_override(tmp, mp):
    return (["train", "--config", "default", "--part", "mw", "--set", "nofield=1"],
            "setting nofield: TrainConfig has no field 'nofield'")


def train_data_not_utf8(tmp, mp):
    from tests.support.train_fixtures import make_tokenizer

    make_tokenizer(tmp / "tok")
    data = _write_bytes(tmp, "write.jsonl", b'{"segments": [{"text": "a\xff", "loss": true}]}\n')
    cfg = tmp / "cfg.py"
    cfg.write_text("from memllm_jax.config import TINY\nfrom memllm_jax.train.config import TrainConfig\n"
                   f"def get_config():\n    return TrainConfig(model=TINY, train_data=({str(data)!r},), "
                   f"tokenizer={str(tmp / 'tok')!r}, workdir={str(tmp / 'run')!r}, steps=1, seq_len=32, global_batch=8)\n")
    offset = data.read_bytes().index(b"\xff")
    return ["train", "--config", str(cfg)], f"write.jsonl: byte offset {offset}: not UTF-8 text"


def memory_not_a_memory(tmp, mp):
    return ["memory", "stats", str(tmp / "nomem")], "nomem: not a memory directory"


def memory_import_bad_field(tmp, mp):
    assert main(["memory", "create", str(tmp / "mem"), "--encoder", "hash:8"]) == 0
    bad = _write_bytes(tmp, "t.jsonl", b'{"subject": "Ann", "object": "Ulm"}\n')
    return ["memory", "import", str(tmp / "mem"), str(bad)], "t.jsonl:1: field 'relation' must be a non-empty string"


def memory_import_not_utf8(tmp, mp):
    assert main(["memory", "create", str(tmp / "mem"), "--encoder", "hash:8"]) == 0
    bad = _write_bytes(tmp, "t.jsonl", b'{"subject": "Ann\xff", "relation": "r", "object": "Ulm"}\n')
    return ["memory", "import", str(tmp / "mem"), str(bad)], "t.jsonl: byte offset 16: not UTF-8 text"


def generate_no_model(tmp, mp):
    return ["generate", "--model", str(tmp / "nomodel"), "hi"], "nomodel: no such file or directory (expected a model"


def generate_prompts_not_utf8(tmp, mp):
    prompts = _write_bytes(tmp, "prompts.txt", b"one\ntw\xffo\n")
    return (["generate", "--model", str(tmp / "nomodel"), "--prompts-file", str(prompts)],
            "prompts.txt: byte offset 6: not UTF-8 text")


def generate_truncated_model_config(tmp, mp):
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text('{"vocab_size": 64,')
    return ["generate", "--model", str(tmp / "model"), "hi"], "config.json: invalid JSON: "


def chat_no_model(tmp, mp):
    return ["chat", "--model", str(tmp / "nomodel"), "--memory", str(tmp / "mem")], "nomodel: no such file or directory"


def generate_model_without_tokenizer(tmp, mp):
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text('{"vocab_size": 64}')
    return ["generate", "--model", str(tmp / "model"), "hi"], "model: no tokenizer stored with this HF model; pass --tokenizer"


def memory_write_not_a_model(tmp, mp):
    (tmp / "notmodel").mkdir()
    (tmp / "c.jsonl").write_text('{"text": "Ann lives in Ulm."}\n')
    return (["memory", "write", "--model", str(tmp / "notmodel"), "--corpus", "c.jsonl", "--memory", "mem"],
            "notmodel: not a model (expected a model checkpoint (<step>/config), a training workdir")


def memory_write_bad_shard(tmp, mp):
    return (["memory", "write", "--model", "m", "--corpus", "c.jsonl", "--memory", "mem", "--process-index", "2",
             "--process-count", "2"], "--process-index 2: must be in 0..1 (--process-count 2)")


def memory_write_no_token_budget(tmp, mp):
    from memllm_jax.model import load

    mp.setattr(load, "load", lambda model, **kw: (object(), object()))  # refused before the model is used
    return (["memory", "write", "--model", "m", "--corpus", "c.jsonl", "--memory", "mem", "--max-new-tokens", "0"],
            "--max-new-tokens 0: must be a positive integer")


def memory_write_ban_repeats_unusable_tokenizer(tmp, mp):
    from tests.support.scripted import CharTokenizer
    from memllm_jax.model import load

    mp.setattr(load, "load", lambda model, **kw: (object(), CharTokenizer()))  # `>>` is two tokens here
    (tmp / "c.jsonl").write_text('{"text": "Ann lives in Ulm."}\n')
    return (["memory", "write", "--model", "m", "--corpus", "c.jsonl", "--memory", "mem", "--ban-repeats", "2"],
            "--ban-repeats 2: repeated-item bans need")


def memory_merge_not_a_memory(tmp, mp):
    (tmp / "nomem").mkdir()
    return ["memory", "merge", str(tmp / "out"), str(tmp / "nomem")], "nomem: not a memory directory (no CURRENT file)"


def memory_merge_missing_shard(tmp, mp):
    assert main(["memory", "create", str(tmp / "mem.shard0"), "--encoder", "hash:8"]) == 0
    progress = {"corpus": str(tmp / "c.jsonl"), "shard": [0, 2], "total": 1, "done": ["0:a"]}
    (tmp / "mem.shard0" / "write_progress.json").write_text(json.dumps(progress))
    return (["memory", "merge", str(tmp / "mem"), str(tmp / "mem.shard0")],
            "mem.shard0: shards [1] of 2 are missing (give all 2 shard directories, or --allow-partial)")


def convert_unfinished_run(tmp, mp):
    (tmp / "run").mkdir()
    (tmp / "run" / "train_config.json").write_text("{}")
    return (["convert", "orbax-to-hf", str(tmp / "run"), str(tmp / "hf"), "--merge-lora"],
            "run: training workdir without a trained model (no model/: the run has not finished)")


def eval_missing_config(tmp, mp):
    (tmp / "run").mkdir()
    return ["eval", "table2", "--out", str(tmp / "run"), "--config", str(tmp / "nope.py")], "nope.py: config file not found"


def eval_zsre_truncated(tmp, mp):
    zsre = _write_bytes(tmp, "zsre.json", b'[{"src": "Who is', )
    (tmp / "run").mkdir()
    return (["eval", "editing", "--out", str(tmp / "run"), "--set", f"editing.records={zsre}"],
            "zsre.json: invalid JSON: Unterminated string starting at: line 1 column 10 (char 9); the file ends")


def eval_zsre_missing_field(tmp, mp):
    zsre = _write_bytes(tmp, "zsre.json", json.dumps([{"src": "Q?", "rephrase": "Q2?", "alt": "A"}]).encode())
    (tmp / "run").mkdir()
    return (["eval", "editing", "--out", str(tmp / "run"), "--set", f"editing.records={zsre}"],
            "zsre.json: record 0: field 'loc' missing")


def run_corpus_truncated(tmp, mp):
    return (["run", "--out", str(tmp / "run"), "--set", f"data.corpus={_truncated(tmp)}", "--stage", "corpus"],
            "c.json: invalid JSON: ")


def run_corpus_missing(tmp, mp):
    return (["run", "--out", str(tmp / "run"), "--set", f"data.corpus={tmp / 'nope.json'}", "--stage", "corpus"],
            "nope.json: not found (setting data.corpus)")


def run_bad_setting(tmp, mp):
    return (["run", "--out", str(tmp / "run"), "--set", "data.synth_docs=abc"],
            "setting data.synth_docs='abc': expected an integer")


def run_missing_config(tmp, mp):
    return ["run", "--config", str(tmp / "nope.py"), "--out", str(tmp / "run")], "nope.py: config file not found"


def bench_busy_host(tmp, mp):
    import datetime

    from memllm_jax.bench import host

    busy = host.HostSample(datetime.datetime.now(datetime.timezone.utc), (9.0, 9.0, 9.0), host.CpuShare(0.9, 0.0),
                           None, 2)
    mp.setattr(host, "sample", lambda seconds=1.0, since=None: busy)
    return ["bench", "decode"], "memllm bench decode: the host is busy"


def convert_missing_source(tmp, mp):
    return ["convert", "hf-to-orbax", str(tmp / "nohf"), str(tmp / "ckpt")], "nohf/config.json does not exist"


def model_size_bad_mesh(tmp, mp):
    return ["model-size", "--mesh", "1,x,1"], "--mesh '1,x,1': expected three positive integers"


def model_size_unknown_preset(tmp, mp):
    return ["model-size", "--preset", "huge"], "--preset 'huge': choose one of"


def memory_create_bad_hash_dim(tmp, mp):
    return ["memory", "create", str(tmp / "mem"), "--encoder", "hash:0"], "--encoder hash:0: DIM of hash:DIM must be a positive"


def memory_import_seq_too_large(tmp, mp):
    assert main(["memory", "create", str(tmp / "mem"), "--encoder", "hash:8"]) == 0
    bad = _write_bytes(tmp, "t.jsonl", b'{"subject": "Ann", "relation": "r", "object": "Ulm", "seq": 100000000000000000000}\n')
    return ["memory", "import", str(tmp / "mem"), str(bad)], "t.jsonl:1: field 'seq' must be in 0..4611686018427387903"


def memory_query_nan_threshold(tmp, mp):
    return ["memory", "query", str(tmp / "mem"), "Ann>>r>>", "--tau-e", "nan"], "--tau-e nan: must be a finite number"


def memory_empty_current(tmp, mp):
    assert main(["memory", "create", str(tmp / "mem"), "--encoder", "hash:8"]) == 0
    (tmp / "mem" / "CURRENT").write_text("")
    return ["memory", "stats", str(tmp / "mem")], "CURRENT: CURRENT is empty"


def memory_write_batch_size_zero(tmp, mp):
    return (["memory", "write", "--model", "m", "--corpus", "c.jsonl", "--memory", "mem", "--batch-size", "0"],
            "--batch-size 0: must be a positive integer")


def memory_write_corpus_missing(tmp, mp):  # refused before the model (which does not exist either) loads
    return (["memory", "write", "--model", "nomodel", "--corpus", "nope.jsonl", "--memory", "mem"],
            "nope.jsonl: no such file")


def model_size_negative_lora_rank(tmp, mp):
    return ["model-size", "--lora-rank", "-3"], "--lora-rank -3: must be a non-negative integer"


def generate_batch_size_zero(tmp, mp):  # an argument error, before the (missing) model is looked at
    return ["generate", "--model", "nomodel", "--batch-size", "0", "hi"], "--batch-size 0: must be a positive integer"


def generate_max_new_tokens_negative(tmp, mp):
    return (["generate", "--model", "nomodel", "--max-new-tokens", "-5", "hi"],
            "--max-new-tokens -5: must be a positive integer")


def generate_temperature_nan(tmp, mp):
    return ["generate", "--model", "nomodel", "--temperature", "nan", "hi"], "--temperature nan: must be a finite number"


def generate_memory_not_a_memory(tmp, mp):  # checked before the (missing) model is looked at
    return ["generate", "--model", "nomodel", "--memory", str(tmp / "nomem"), "hi"], "nomem: no memory there"


def generate_html_is_a_directory(tmp, mp):
    (tmp / "page").mkdir()
    return (["generate", "--model", "nomodel", "--html", str(tmp / "page"), "hi"],
            "page: is a directory, not a file to write")


def generate_gguf_is_a_directory(tmp, mp):
    (tmp / "x.gguf").mkdir()
    return ["generate", "--model", str(tmp / "x.gguf"), "hi"], "x.gguf: is a directory, not a .gguf file"


def chat_memory_is_a_file(tmp, mp):
    (tmp / "mem").write_text("")
    return ["chat", "--model", "nomodel", "--memory", str(tmp / "mem")], "mem: not a directory"


def chat_max_new_tokens_zero(tmp, mp):
    return (["chat", "--model", "nomodel", "--memory", "mem", "--max-new-tokens", "0"],
            "--max-new-tokens 0: must be a positive integer")


def data_synth_other_rel_info(tmp, mp):
    (tmp / "d").mkdir()
    (tmp / "d" / "rel_info.json").write_text('{"P17": "country"}')
    return (["data", "synth", "--out", str(tmp / "d" / "x.json"), "--docs", "2"],
            "rel_info.json: a different relation label file is already there")


def eval_out_missing(tmp, mp):
    return ["eval", "table2", "--out", str(tmp / "norun")], "--out " + str(tmp / "norun") + ": no pipeline output directory"


CASES = {name.replace("_", "-"): fn for name, fn in list(globals().items())
         if callable(fn) and name.split("_")[0] in ("data", "train", "memory", "generate", "chat", "eval", "run",
                                                     "bench", "convert", "model") and fn.__module__ == __name__}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_exit_2(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv, expected = CASES[case](tmp_path, monkeypatch)
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = err.rstrip("\n").split("\n")[-1]  # a bench's busy-host warning banner comes before the error line
    assert last.startswith("error: ") and expected in last, err
    assert "Traceback" not in err
    if case != "bench-busy-host":
        assert err.count("\n") == 1, err


def test_a_failed_build_leaves_nothing_behind(tmp_path, capsys):
    docs = _docs()
    del docs[2]["sents"]  # the first two documents build, the third fails
    corpus = _corpus(tmp_path, docs=docs)
    assert main(_build(corpus)) == 2
    assert "document 2" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "write.jsonl").write_text("old\n")
    assert main(_build(corpus)) == 2
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["write.jsonl"]  # no temp files, old output intact
    assert (tmp_path / "out" / "write.jsonl").read_text() == "old\n"


def test_data_build_without_labels_uses_the_synthetic_table(tmp_path, capsys):
    assert main(_build(_corpus(tmp_path), "--kinds", "eval")) == 0
    assert (tmp_path / "out" / "eval.jsonl").exists()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(ValueError, match="no documents"):
        main(["--debug", *_build(_corpus(tmp_path, docs=[]))])


def test_subprocess_exit_status_and_stderr(tmp_path):
    corpus = _truncated(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "memllm_jax.cli", *_build(corpus)], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and r.stdout == ""
    assert re.fullmatch(r"error: \S*c\.json: element 1 \(char \d+\): invalid JSON: .*\(truncated\?\)\n", r.stderr), r.stderr
    r = subprocess.run([sys.executable, "-m", "memllm_jax.cli", "--debug", *_build(corpus)], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 1 and "Traceback" in r.stderr


def test_docs_table_lists_every_case():
    text = (ROOT / "docs" / "errors.md").read_text()
    documented = re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.M)
    assert sorted(documented) == sorted(CASES)


@pytest.mark.parametrize("spec", ["hash:0", "hash:-1", "hash:abc", "nodir"])
def test_a_refused_encoder_creates_no_memory_folder(spec, tmp_path, capsys):
    assert main(["memory", "create", str(tmp_path / "mem"), "--encoder", spec]) == 2
    assert capsys.readouterr().err.startswith(f"error: --encoder {spec}: ")
    assert not (tmp_path / "mem").exists()


def test_data_synth_keeps_an_equal_rel_info_and_refuses_another(tmp_path, capsys):
    assert main(["data", "synth", "--out", str(tmp_path / "a.json"), "--docs", "2"]) == 0
    labels = (tmp_path / "rel_info.json").read_text()
    assert main(["data", "synth", "--out", str(tmp_path / "b.json"), "--docs", "2", "--seed", "1"]) == 0
    assert (tmp_path / "b.json").exists() and (tmp_path / "rel_info.json").read_text() == labels
    (tmp_path / "rel_info.json").write_text('{"P17": "country"}')
    capsys.readouterr()
    assert main(["data", "synth", "--out", str(tmp_path / "c.json"), "--docs", "2"]) == 2
    assert not (tmp_path / "c.json").exists() and (tmp_path / "rel_info.json").read_text() == '{"P17": "country"}'


def test_data_build_removes_an_earlier_builds_files(tmp_path, capsys):
    corpus = _corpus(tmp_path)
    assert main(_build(corpus)) == 0
    out = tmp_path / "out"
    assert {p.name for p in out.iterdir()} == {"write.jsonl", "read.jsonl", "eval.jsonl", "coverage.jsonl", "stats.json"}
    (out / "notes.txt").write_text("mine")  # not a build output: kept
    assert main(_build(corpus, "--kinds", "eval")) == 0
    assert {p.name for p in out.iterdir()} == {"eval.jsonl", "stats.json", "notes.txt"}


def test_argument_errors_are_one_line(tmp_path, capsys):
    assert main(["memory"]) == 2
    err = capsys.readouterr().err
    assert err == "error: memllm memory: the following arguments are required: action (see memllm memory --help)\n"
    assert main(["generate", "--model", "m", "--top-p", "0", "hi"]) == 2
    assert capsys.readouterr().err == "error: --top-p 0: must be in (0, 1]\n"
    assert main(["data", "synth", "--out", "x.json", "--docs", "x"]) == 2
    assert capsys.readouterr().err == "error: --docs: invalid int value: 'x'\n"
    assert main(["memory", "frobnicate"]) == 2
    assert capsys.readouterr().err.startswith("error: memllm memory: invalid choice: 'frobnicate' (choose from 'create'")


def test_memory_help_lists_write_and_merge_without_jax():
    code = ("import sys, contextlib, io\nfrom memllm_jax.cli import main\nout = io.StringIO()\n"
            "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out):\n    main(['memory', '--help'])\n"
            "print(out.getvalue()); print('jax imported' if 'jax' in sys.modules else 'no jax')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert "{create,add,import,export,query,delete,stats,show,write,merge}" in r.stdout
    assert re.search(r"^\s+write\s+write a corpus into a memory", r.stdout, flags=re.M)
    assert re.search(r"^\s+merge\s+join the shards", r.stdout, flags=re.M)
    assert r.stdout.rstrip().endswith("no jax")


def _parsers(parser):
    """`parser` and every subcommand parser below it."""
    yield parser
    if getattr(parser, "subcommands", None) is not None:
        for sub in dict.fromkeys(parser.subcommands.choices.values()):
            yield from _parsers(sub)


def test_every_option_with_a_default_shows_it():
    import importlib

    from memllm_jax.cli import COMMANDS, SUBCOMMANDS, CommandParser

    modules = {**{name: module for name, (module, _) in COMMANDS.items()},
               **{" ".join(key): module for key, (module, _) in SUBCOMMANDS.items()}}
    checked = 0
    for name, module in modules.items():
        parser = CommandParser(prog=f"memllm {name}")
        importlib.import_module(module).add_arguments(parser)
        for p in _parsers(parser):
            text = " ".join(p.format_help().split())
            for action in p._actions:
                if action.option_strings and isinstance(action.default, (int, float, str)) \
                        and not isinstance(action.default, bool) and action.default != argparse.SUPPRESS:
                    assert f"(default: {action.default})" in text or "(default" in (action.help or ""), \
                        (p.prog, action.option_strings)
                    checked += 1
    assert checked > 50


def test_model_size_help_lists_every_preset(capsys):
    from memllm_jax.config import PRESETS

    with pytest.raises(SystemExit):
        main(["model-size", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(name in text for name in PRESETS) and "smollm2_135m" in text
