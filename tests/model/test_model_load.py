"""One model loader for every command (`memllm_jax.model.load`): `memllm train` writes `<workdir>/model` (base
or adapter + configs + tokenizer); `convert orbax-to-hf` / `orbax-to-peft`, `generate`, `chat` and `memory
write` open it as a workdir, a checkpoint or an HF directory, each saying which on stderr; the HF export's logits
(transformers, torch) equal the trained model's. Opening a model reads each of its files once; a model config
that disagrees with the weights' own is an error; an old `params/` workdir is refused in one line."""

import collections
import dataclasses
import json
import os
import sys

import numpy as np
import pytest

from memllm_jax.cli import main
from memllm_jax.config import TINY
from memllm_jax.errors import InputError
from memllm_jax.model.load import load
from tests.support.train_fixtures import lm_records, make_tokenizer, write_jsonl, write_records

# One worker runs the module (`--dist loadgroup`): its trained workdirs are built once, not once per worker.
pytestmark = pytest.mark.xdist_group("model_load")

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
    tmp = tmp_path_factory.mktemp("load")
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

    from tests.support.hf_models import hf_logits

    m = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager", dtype=torch.float32).eval()
    positions = np.tile(np.arange(tokens.shape[1]), (tokens.shape[0], 1))
    return hf_logits(m, tokens, positions, np.ones(tokens.shape, bool))


def test_training_writes_one_checkpoint_that_convert_exports(runs, tmp_path, capsys):
    from memllm_jax.checkpoint import read_stored

    tmp, pre, lora = runs
    stored = read_stored(lora / "model")
    assert stored.base == {"source": str(pre), "extra_tokens": 0} and stored.lora is not None
    assert (lora / "model" / "tokenizer" / "tokenizer.json").exists()
    trained, _ = load(lora, say=None)
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
    np.testing.assert_allclose(_torch(tmp_path / "base_hf", tokens), _ours(load(pre, say=None)[0], tokens),
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


def test_an_adapter_that_names_no_base_opens_on_the_base_given(runs, tmp_path, capsys):
    import shutil

    tmp, pre, lora = runs
    shutil.copytree(lora / "model", tmp_path / "adapter")
    config = next((tmp_path / "adapter").glob("*/config/metadata"))
    config.write_text(json.dumps({**json.loads(config.read_text()), "base": None}))
    with pytest.raises(ValueError, match="has no base parameters"):
        load(tmp_path / "adapter", say=None)
    tokens = _tokens()
    want = _ours(load(lora, say=None)[0], tokens)
    np.testing.assert_array_equal(_ours(load(tmp_path / "adapter", base=str(pre), say=None)[0], tokens), want)
    capsys.readouterr()
    assert main(["convert", "orbax-to-hf", str(tmp_path / "adapter"), str(tmp_path / "hf"), "--merge-lora", "--base",
                 str(pre)]) == 0
    assert f"adapter over {pre}" in capsys.readouterr().err
    np.testing.assert_allclose(_torch(tmp_path / "hf", tokens), want, atol=2e-4)


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
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "train_config.json").write_text("{}")
    (tmp_path / "old" / "params").mkdir()
    old = "a training workdir of the old params/ layout, which is no longer read (expected a model checkpoint"
    for path, message in [(tmp_path / "nope", "nope: no such file or directory (expected a model checkpoint"),
                          (tmp_path / "empty", "empty: not a model (expected a model checkpoint"),
                          (tmp_path / "run", "run: training workdir without a trained model"),
                          (tmp_path / "old", f"old: {old}"), (tmp_path / "old" / "params", f"params: {old}")]:
        assert main(["convert", "orbax-to-hf", str(path), str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


SMALL = dataclasses.replace(TINY, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, vocab_size=400)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    """A tiny HF directory (transformers' `save_pretrained`) with a tokenizer beside the weights."""
    from tests.support.hf_models import save_hf_mistral

    d = tmp_path_factory.mktemp("hf") / "hf"
    save_hf_mistral(SMALL, d)
    make_tokenizer(d)
    return d


def test_an_adapter_over_an_hf_base_opens_merged_without_drawing_fresh_adapters(hf_dir, tmp_path, monkeypatch):
    """The pipeline's case: an adapter-only checkpoint over an HF directory opens as its base with the adapter
    folded in, the adapter's arrays taken from the checkpoint (no fresh adapters drawn only to be overwritten)."""
    import jax
    from flax import nnx

    import memllm_jax.model.placement as P
    from memllm_jax.checkpoint import save_params
    from memllm_jax.config import LoraConfig
    from memllm_jax.model.load import base_reference
    from memllm_jax.model.lora import merge_lora

    model, tok = load(hf_dir, lora=LoraConfig(rank=4, alpha=8.0, dropout=0.0), say=None)  # dropout: RNG state to draw
    for i, (_, var) in enumerate(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))):  # a trained adapter: B != 0
        value = var.get_value()
        var.set_value(value + 0.01 * jax.random.normal(jax.random.key(i), value.shape, value.dtype))
    save_params(tmp_path / "adapter", 0, model, base=base_reference(str(hf_dir), model.cfg.vocab_size), tokenizer=tok)
    tokens = _tokens()
    merge_lora(model)
    want = _ours(model, tokens)
    drawn = []
    monkeypatch.setattr(P, "eval_needed", lambda fn: drawn.append(fn) or fn())
    opened, _ = load(tmp_path / "adapter", say=None)
    assert opened.lora_cfg is None and not drawn
    np.testing.assert_array_equal(_ours(opened, tokens), want)


def test_a_config_that_disagrees_with_the_weights_is_an_error(hf_dir, tmp_path, capsys):
    for field, value in [("n_layers", 3), ("d_model", 64), ("n_kv_heads", 4), ("rope_theta", 500000.0),
                         ("vocab_size", 512), ("tie_embeddings", True)]:
        with pytest.raises(InputError) as info:
            load(hf_dir, config=dataclasses.replace(SMALL, **{field: value}), say=None)
        assert str(info.value) == (f"{hf_dir / 'config.json'}: {field} is {getattr(SMALL, field)!r} in the weights' "
                                   f"config but {value!r} in the model config given")
    # agreeing: the run-time fields are the config's, the architecture the weights'
    model, tok = load(hf_dir, config=dataclasses.replace(SMALL, scan_layers=False, param_dtype="bfloat16"), say=None)
    assert not model.cfg.scan_layers and model.cfg.param_dtype == "bfloat16" and model.cfg.d_ff == SMALL.d_ff
    assert str(model.embed[...].dtype) == "bfloat16"
    # a checkpoint's stored config is the weights' config too
    from memllm_jax.checkpoint import save_params

    save_params(tmp_path / "ckpt", 0, model, tokenizer=tok)
    with pytest.raises(InputError, match=r"ckpt \(step 0\): n_heads is 4 in the weights' config but 8"):
        load(tmp_path / "ckpt", config=dataclasses.replace(SMALL, n_heads=8), say=None)
    # a training run whose preset does not describe its base: one line, exit 2, nothing trained
    data = write_jsonl(tmp_path / "w.jsonl", write_records(20))
    path = tmp_path / "mw.py"
    path.write_text(CONFIG.format(name="mw", mode="lora", data=data, tok=hf_dir, steps=1, init=str(hf_dir),
                                  workdir=tmp_path / "mw").replace("d_ff=64)", "d_ff=64, vocab_size=400)")
                    .replace("d_model=32", "d_model=48"))
    capsys.readouterr()
    assert main(["train", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "config.json: d_model is 32 in the weights' config but 48 in the model config given" in err
    assert not (tmp_path / "mw" / "model").exists()


OPENS: list = []
"""While `Reads` is active: every path Python code opens (the `open` audit event, which covers `open`,
`io.open`, `pathlib` reads and `os.open`)."""
_HOOKED: list = []


def _audit(event, args):
    if event == "open" and OPENS and isinstance(args[0], (str, bytes, os.PathLike)):
        OPENS[0][os.fsdecode(args[0])] += 1


class Reads:
    """Every read `model.load` makes of a model's files, by what it reads: a JSON config (`load_json`), a
    safetensors file, a tokenizer, a checkpoint's stored configs, a checkpoint's weights, a GGUF conversion;
    and the files Python code opens."""

    def __init__(self, monkeypatch):
        if not _HOOKED:  # an audit hook cannot be removed: one per process, counting only while OPENS is set
            sys.addaudithook(_audit)
            _HOOKED.append(True)
        self.opened = collections.Counter()
        OPENS[:] = [self.opened]
        import safetensors

        import memllm_jax.checkpoint as C
        import memllm_jax.model.gguf as G
        import memllm_jax.model.load as L

        self.count = collections.Counter()
        for module, name, what in [(L, "load_json", "json"), (safetensors, "safe_open", "safetensors"),
                                   (L, "load_tokenizer", "tokenizer"), (C, "read_stored", "checkpoint config"),
                                   (C, "restore_params", "checkpoint weights"), (G, "gguf_to_hf", "gguf")]:
            monkeypatch.setattr(module, name, self._counted(getattr(module, name), what))

    def _counted(self, read, what):
        def counted(path, *args, **kwargs):
            self.count[what, str(path)] += 1
            return read(path, *args, **kwargs)

        return counted

    def take(self) -> dict:
        out = dict(self.count)
        self.count.clear()
        return out

    def opened_under(self, directory) -> dict:
        """The files under `directory` that Python code opened since the last call, with how often."""
        out = {p: n for p, n in self.opened.items() if p.startswith(str(directory) + os.sep)}
        self.opened.clear()
        return out


def test_opening_a_model_reads_each_of_its_files_once(runs, hf_dir, tmp_path, monkeypatch):
    reads = Reads(monkeypatch)
    try:
        _each_file_once(reads, runs, hf_dir, tmp_path, monkeypatch)
    finally:
        OPENS.clear()


def _each_file_once(reads, runs, hf_dir, tmp_path, monkeypatch):
    import shutil

    import memllm_jax.model.gguf as G

    tmp, pre, lora = runs
    # an HF directory: config.json, the weights and the tokenizer, once each (safetensors and the tokenizer's
    # JSON are read by Rust code, which the audit hook does not see: config.json is the one Python opens)
    reads.opened_under(hf_dir)
    model, tok = load(hf_dir, say=None)
    assert reads.take() == {("json", str(hf_dir / "config.json")): 1,
                            ("safetensors", str(hf_dir / "model.safetensors")): 1, ("tokenizer", str(hf_dir)): 1}
    assert reads.opened_under(hf_dir) == {str(hf_dir / "config.json"): 1}
    # sharded weights: each shard once
    from tests.support.hf_models import save_hf_mistral

    save_hf_mistral(SMALL, tmp_path / "sharded", max_shard_size="20KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 2
    reads.opened_under(tmp_path)
    load(tmp_path / "sharded", say=None)
    assert reads.take() == {("json", str(tmp_path / "sharded" / "config.json")): 1,
                            **{("safetensors", str(tmp_path / "sharded" / s)): 1 for s in shards}}
    assert reads.opened_under(tmp_path / "sharded") == {str(tmp_path / "sharded" / f): 1
                                                         for f in ("config.json", "model.safetensors.index.json")}
    # a model checkpoint: its configs, its weights, its tokenizer
    from memllm_jax.checkpoint import save_params

    save_params(tmp_path / "ckpt", 0, model, tokenizer=tok)
    reads.take()
    load(tmp_path / "ckpt", say=None)
    ckpt = str(tmp_path / "ckpt")
    assert reads.take() == {("checkpoint config", ckpt): 1, ("checkpoint weights", ckpt): 1,
                            ("tokenizer", str(tmp_path / "ckpt" / "tokenizer")): 1}
    # a training workdir with an adapter: its checkpoint and the base's (a workdir too), nothing twice; the base's
    # tokenizer is not read (the adapter's is the one)
    load(lora, say=None)
    assert reads.take() == {("checkpoint config", str(lora / "model")): 1,
                            ("checkpoint weights", str(lora / "model")): 1,
                            ("tokenizer", str(lora / "model" / "tokenizer")): 1,
                            ("checkpoint config", str(pre / "model")): 1, ("checkpoint weights", str(pre / "model")): 1}
    # a tokenizer given as an object is not read again
    load(lora, tokenizer=tok, say=None)
    assert ("tokenizer", str(lora / "model" / "tokenizer")) not in reads.take()
    # a .gguf file: converted once (into the cache), then read as that HF directory, each file once
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("MEMLLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(G, "gguf_to_hf", reads._counted(lambda src, out: shutil.copytree(hf_dir, out), "gguf"))
    for first in (True, False):
        load(gguf, say=None)
        cached = G.resolve_model_dir(gguf)
        got = reads.take()
        assert got == {**({("gguf", str(gguf)): 1} if first else {}), ("json", str(cached / "config.json")): 1,
                       ("safetensors", str(cached / "model.safetensors")): 1, ("tokenizer", str(cached)): 1}
        if not first:  # (the first time the fake conversion's copy opens every file)
            assert reads.opened_under(cached) == {str(cached / "config.json"): 1}
        reads.opened_under(tmp_path)
