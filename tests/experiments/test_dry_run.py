"""`memllm run --config mistral7b --dry-run`: the paper's run checked against stand-ins for its inputs (a tiny
Mistral-architecture checkpoint, small DocRED-format files, a ZsRE file): every missing or malformed input in one
line each, the stages' work, and each adapter's train step compiled ahead of time on 8 fake host devices."""

import dataclasses
import json

import pytest

from data_gen.synthetic import iter_synthetic, synthetic_rel_info
from memllm_jax import cli
from memllm_jax.config import TINY
from memllm_jax.model.hf import config_to_hf

ARCH = dataclasses.replace(TINY, param_dtype="bfloat16", compute_dtype="bfloat16", remat=True, max_seq_len=1024)
ZSRE = {"src": "Who is the mother of Ann Vu?", "rephrase": "Ann Vu's mother is who?", "alt": "Ida Vu",
        "loc": "nq question: who wrote hamlet", "loc_ans": "Shakespeare"}


@pytest.fixture()
def inputs(tmp_path, monkeypatch):
    """Stand-ins for Re-DocRED train / dev / test, DocRED's labels, ZsRE and Mistral-7B, found through the
    environment variables the config reads."""
    from transformers import MistralConfig, MistralForCausalLM

    redocred = tmp_path / "redocred"
    redocred.mkdir()
    for split, n, seed in (("train", 12, 1), ("dev", 4, 2), ("test", 6, 3)):
        (redocred / f"{split}_revised.json").write_text(json.dumps(list(iter_synthetic(n, seed=seed))))
    (tmp_path / "rel_info.json").write_text(json.dumps(synthetic_rel_info()))
    (tmp_path / "zsre.json").write_text(json.dumps([ZSRE] * 3))
    hf = config_to_hf(ARCH)
    MistralForCausalLM(MistralConfig(**{k: v for k, v in hf.items() if k not in ("architectures", "model_type")})
                       ).save_pretrained(tmp_path / "mistral")
    monkeypatch.setenv("MEMLLM_REDOCRED", str(redocred))
    monkeypatch.setenv("MEMLLM_DOCRED", str(tmp_path))
    monkeypatch.setenv("MEMLLM_ZSRE", str(tmp_path / "zsre.json"))
    monkeypatch.setenv("MISTRAL_7B_DIR", str(tmp_path / "mistral"))
    config = tmp_path / "paper_tiny.py"  # the paper's config with the stand-in model's architecture
    config.write_text(
        "import dataclasses\n"
        "from experiments.configs import mistral7b\n"
        "from memllm_jax.config import TINY\n"
        "from memllm_jax.settings import replace\n"
        "ARCH = dataclasses.replace(TINY, param_dtype='bfloat16', compute_dtype='bfloat16', remat=True, max_seq_len=1024)\n"
        "def get_config():\n"
        "    cfg = mistral7b.get_config()\n"
        "    return replace(cfg, {'data.eval_docs': 3, 'editing.n_edits': 3, 'mw.model': ARCH, 'mr.model': ARCH,\n"
        "                         'mw.global_batch': 8, 'mw.micro_batches': 1, 'mr.global_batch': 8, 'mr.micro_batches': 1,\n"
        "                         'mw.seq_len': 128, 'mr.seq_len': 128})\n")
    return tmp_path, config


@pytest.mark.slow
def test_the_papers_run_is_checked_sized_and_planned(inputs, capsys):
    tmp, config = inputs
    assert cli.main(["run", "--config", str(config), "--out", str(tmp / "run"), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "every input is readable" in out
    assert "12 training, 0 outside, 3 evaluation documents; 4 development documents" in out
    assert "memory-write calls for the 3 outside and evaluation documents" in out
    assert "3 edits" in out and "9 rows x 3 documents" in out
    for part in ("mw", "mr"):  # each adapter's train step, FSDP over the 8 fake devices
        assert f"  {part}: train step on mesh {{'data': 1, 'fsdp': 8, 'tensor': 1}} (cpu devices)" in out
    assert "peak" in out and not (tmp / "run").exists()  # nothing written


def test_every_missing_or_malformed_input_is_one_line(inputs, capsys):
    tmp, config = inputs
    (tmp / "redocred" / "dev_revised.json").unlink()
    (tmp / "zsre.json").write_text('[{"src": "Who')
    assert cli.main(["run", "--config", str(config), "--out", str(tmp / "run"), "--dry-run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {tmp / 'redocred' / 'dev_revised.json'}: not found (setting data.dev_corpus)"]
    (tmp / "redocred" / "dev_revised.json").write_text(json.dumps([{"title": "x"}]))
    assert cli.main(["run", "--config", str(config), "--out", str(tmp / "run"), "--dry-run"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "dev_revised.json: document 0" in err[0] and "zsre.json: invalid JSON" in err[1]


def test_a_model_setting_that_disagrees_with_the_base_is_named(inputs, capsys):
    tmp, config = inputs
    argv = ["run", "--config", str(config), "--out", str(tmp / "run"), "--dry-run", "--set", "mw.model.n_layers=3"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == (f"error: setting mw.model.n_layers=3: the base {tmp / 'mistral'} has 2")


def test_the_two_hop_stage_says_its_work():
    from experiments import dry_run
    from experiments.configs import default, two_hop

    said = dict(dry_run.work(two_hop.get_config(), {}))
    assert said["two_hop"] == "200 two-hop questions over the evaluation documents' facts, 3 conditions, " \
                              "<= 64 tokens each, reads kept"
    assert dict(dry_run.work(default.get_config(), {}))["two_hop"] == "none"


def test_the_beyond_paper_config_says_its_phrase_edits_and_needs_a_heldout_world():
    from experiments import dry_run
    from experiments.configs import beyond_paper, default
    from memllm_jax.errors import InputError
    from memllm_jax.settings import check_tree, replace

    cfg = beyond_paper.get_config()
    said = dict(dry_run.work(cfg, {}))
    assert said["editing"].endswith("; <= 200 phrase-relation edits each of held-out and seen relations, sequential")
    assert "phrase" not in dict(dry_run.work(default.get_config(), {}))["editing"]
    with pytest.raises(InputError, match="data.phrase_relations"):
        check_tree(replace(cfg, {"data.heldout_world": False}))
