"""One model checkpoint for every command: `memllm train` writes `<workdir>/model` (base or adapter + configs +
tokenizer); `convert orbax-to-hf` / `orbax-to-peft`, `generate`, `chat` and `memory write` open it as a workdir,
a checkpoint, an HF directory or a legacy `params/` workdir, each saying which on stderr; the HF export's logits
(transformers, torch) equal the trained model's."""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from memllm_jax.cli import main
from tests.support.train_fixtures import lm_records, make_tokenizer, write_jsonl, write_records

CONFIG = """
import dataclasses
from memllm_jax.config import TINY, LoraConfig, MeshConfig
from memllm_jax.train.config import TrainConfig

def get_config():
    model = dataclasses.replace(TINY, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64)
    return TrainConfig(name="{name}", model=model, mode="{mode}", lora=LoraConfig(rank=4, alpha=8.0),
                       train_data=("{data}",), tokenizer="{tok}", seq_len=64, packing="pack", global_batch=8,
                       steps={steps}, lr=3e-3, warmup_steps=1, eval_fraction=0.0, eval_every=0, checkpoint_every=0,
                       init_checkpoint={init!r}, workdir="{workdir}", mesh=MeshConfig(data=8, fsdp=1, tensor=1),
                       progress=False, async_checkpoint=False)
"""


def _train(tmp, name, mode, data, steps, init):
    path = tmp / f"{name}.py"
    path.write_text(CONFIG.format(name=name, mode=mode, data=data, tok=tmp / "tok", steps=steps, init=init,
                                  workdir=tmp / name))
    assert main(["train", "--config", str(path)]) == 0
    return tmp / name


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sources")
    make_tokenizer(tmp / "tok")
    pre = _train(tmp, "pre", "full", write_jsonl(tmp / "lm.jsonl", lm_records(60)), 3, None)
    lora = _train(tmp, "mw", "lora", write_jsonl(tmp / "w.jsonl", write_records(60)), 2, str(pre))
    return tmp, pre, lora


def _tokens():
    rng = np.random.default_rng(0)
    return rng.integers(1, 300, (2, 12)).astype(np.int32)


def _ours(model, tokens):
    positions = np.tile(np.arange(tokens.shape[1], dtype=np.int32), (tokens.shape[0], 1))
    return np.asarray(model(tokens, positions, np.ones(tokens.shape, bool))[0])


def _torch(hf_dir, tokens):
    import torch
    from transformers import AutoModelForCausalLM

    from memllm_jax.model.testing import hf_logits

    m = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager", dtype=torch.float32).eval()
    positions = np.tile(np.arange(tokens.shape[1]), (tokens.shape[0], 1))
    return hf_logits(m, tokens, positions, np.ones(tokens.shape, bool))


@pytest.mark.slow
def test_training_writes_one_checkpoint_that_convert_exports(runs, tmp_path, capsys):
    from memllm_jax.checkpoint import read_stored
    from memllm_jax.train.loop import load_trained_model

    tmp, pre, lora = runs
    stored = read_stored(lora / "model")
    assert stored.base == {"source": str(pre), "extra_tokens": 0} and stored.lora is not None
    assert (lora / "model" / "tokenizer" / "tokenizer.json").exists()
    trained = load_trained_model(str(lora))
    tokens = _tokens()
    want = _ours(trained, tokens)

    capsys.readouterr()
    assert main(["convert", "orbax-to-hf", str(lora), str(tmp_path / "hf"), "--merge-lora"]) == 0
    err = capsys.readouterr().err
    assert f"model: training workdir {lora}" in err and "adapter over" in err
    assert (tmp_path / "hf" / "tokenizer.json").exists()  # the HF export is self-contained
    np.testing.assert_allclose(_torch(tmp_path / "hf", tokens), want, atol=2e-4)
    # without --merge-lora the export is the base, and it says so
    assert main(["convert", "orbax-to-hf", str(lora / "model"), str(tmp_path / "base_hf")]) == 0
    assert "not in this export" in capsys.readouterr().err
    np.testing.assert_allclose(_torch(tmp_path / "base_hf", tokens), _ours(load_trained_model(str(pre)), tokens),
                               atol=2e-4)

    assert main(["convert", "orbax-to-peft", str(lora), str(tmp_path / "peft")]) == 0
    adapter = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(pre) and adapter["r"] == 4

    # HF -> checkpoint (tokenizer beside it) -> generate reads it
    assert main(["convert", "hf-to-orbax", str(tmp_path / "hf"), str(tmp_path / "ckpt")]) == 0
    assert (tmp_path / "ckpt" / "tokenizer" / "tokenizer.json").exists()
    capsys.readouterr()
    assert main(["generate", "--model", str(tmp_path / "ckpt"), "Ada Lovelace was born in", "--max-new-tokens",
                 "3"]) == 0
    out = capsys.readouterr()
    assert f"model: checkpoint {tmp_path / 'ckpt'}, step 0" in out.err and out.out.startswith("Ada Lovelace")


@pytest.mark.slow
def test_legacy_params_workdir_still_opens(runs, tmp_path, capsys):
    """A run from before `<workdir>/model`: its `params/` (adapter keyed by pytree path) with train_config.json."""
    import orbax.checkpoint as ocp

    from memllm_jax.train.loop import load_trained_model

    tmp, pre, lora = runs
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    shutil.copy(lora / "train_config.json", legacy / "train_config.json")
    adapter = nnx.state(load_trained_model(str(lora), merge=False), nnx.LoRAParam)
    flat = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_flatten_with_path(adapter)[0]}
    with ocp.StandardCheckpointer() as ck:  # what train/checkpoint.py save_params wrote
        ck.save(legacy / "params", flat)
    tokens = _tokens()
    capsys.readouterr()
    assert main(["convert", "orbax-to-hf", str(legacy / "params"), str(tmp_path / "hf"), "--merge-lora"]) == 0
    assert "model: training workdir (legacy params/)" in capsys.readouterr().err
    np.testing.assert_allclose(_torch(tmp_path / "hf", tokens), _ours(load_trained_model(str(lora)), tokens),
                               atol=2e-4)


@pytest.mark.slow
def test_generate_chat_and_memory_write_open_a_workdir(runs, tmp_path, capsys, monkeypatch):
    import io

    tmp, pre, lora = runs
    capsys.readouterr()
    assert main(["generate", "--model", str(lora), "Grace Hopper lives in", "--max-new-tokens", "3"]) == 0
    assert f"model: training workdir {lora} ({lora / 'model'}), step 2" in capsys.readouterr().err
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "sentences": ["Ada Lovelace was born in Paris."]}) + "\n")
    assert main(["memory", "write", "--model", str(lora / "model"), "--corpus", str(corpus), "--memory",
                 str(tmp_path / "mem"), "--encoder", "hash:16", "--max-new-tokens", "8"]) == 0
    assert "model: checkpoint" in capsys.readouterr().err and (tmp_path / "mem" / "CURRENT").exists()
    monkeypatch.setattr("sys.stdin", io.StringIO("Alan Turing lives in Rome.\n"))
    assert main(["chat", "--model", str(pre), "--memory", str(tmp_path / "mem2"), "--encoder", "hash:16",
                 "--max-new-tokens", "4"]) == 0
    assert f"model: training workdir {pre}" in capsys.readouterr().err


def test_wrong_model_paths_are_one_line_errors(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_config.json").write_text("{}")
    for path, message in [(tmp_path / "nope", "nope: no such file or directory (expected a model checkpoint"),
                          (tmp_path / "empty", "empty: not a model (expected a model checkpoint"),
                          (tmp_path / "run", "run: training workdir without a trained model")]:
        assert main(["convert", "orbax-to-hf", str(path), str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
