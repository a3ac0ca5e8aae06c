"""Whole runs: tiny pretraining beats the unigram baseline; a LoRA adapter trained from it lowers its span
loss; a run killed mid-way resumes to bitwise the same parameters; NaN stops the run keeping good checkpoints;
checkpoints restore into another mesh; the loop calls its hooks, and on a CPU host the runtime's."""

import json
import os
import re
import types

import jax
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import TINY, LoraConfig, MeshConfig
from memllm_jax.model.load import load
from memllm_jax.model.placement import create_model
from memllm_jax.runtime import host_memory, train_hook
from memllm_jax.train import loop
from memllm_jax.train.checkpoint import Checkpointer
from memllm_jax.train.config import TrainConfig
from tests.support.train_fixtures import lm_records, make_tokenizer, write_jsonl, write_records

# One worker runs the module (`--dist loadgroup`): its pretrained model is trained once, not once per worker.
pytestmark = pytest.mark.xdist_group("train_loop")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("train")
    make_tokenizer(d / "tok")
    return {"dir": d, "tok": str(d / "tok"), "lm": write_jsonl(d / "lm.jsonl", lm_records(300)),
            "write": write_jsonl(d / "w.jsonl", write_records(200))}


@pytest.fixture(scope="module")
def pretrained(files):
    cfg = TrainConfig(name="pretrain", model=TINY, mode="full", train_data=(files["lm"],), tokenizer=files["tok"],
                      seq_len=64, packing="pack", global_batch=8, steps=40, lr=3e-3, warmup_steps=5,
                      eval_fraction=0.05, eval_every=20, checkpoint_every=20, workdir=str(files["dir"] / "pre"),
                      mesh=MeshConfig(data=4, fsdp=2, tensor=1), progress=False)
    return cfg, loop.run(cfg)


@pytest.mark.slow
def test_pretraining_beats_unigram_and_writes_outputs(pretrained):
    cfg, r = pretrained
    assert r.eval_loss < 0.5 * r.unigram_eval_loss, (r.eval_loss, r.unigram_eval_loss)
    lines = [json.loads(x) for x in open(r.metrics_path)]
    assert [x["step"] for x in lines if x["kind"] == "eval"] == [0, 20, 40]
    assert all(np.isfinite(x["tokens_per_s"]) for x in lines if x["kind"] == "train")
    assert all(0 < x["host_rss_gb"] <= x["host_peak_gb"] for x in lines if x["kind"] == "train")  # the process's memory
    assert os.path.getsize(r.plot_path) > 1000
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(os.path.join(r.workdir, "tb")))
    from memllm_jax.checkpoint import is_checkpoint, read_stored
    from memllm_jax.model.load import identify

    assert r.model_dir == os.path.join(r.workdir, "model") and is_checkpoint(r.model_dir)
    stored = read_stored(r.model_dir)
    assert stored.step == 40 and stored.base is None and stored.tokenizer is not None  # full model + tokenizer
    model, _ = load(r.workdir, say=None)
    direct, _ = load(r.model_dir, say=None)
    assert identify(r.workdir).kind == "training workdir" and identify(r.model_dir).kind == "checkpoint"
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(nnx.state(model, nnx.Param)),
                                                    jax.tree.leaves(nnx.state(direct, nnx.Param))))


def lora_cfg(files, pretrained, workdir, **kw):
    base = dict(name="mw", model=TINY, mode="lora", lora=LoraConfig(rank=4, alpha=8.0, dropout=0.1),
                train_data=(files["write"],), tokenizer=files["tok"], seq_len=128, buckets=(128,), packing="pad",
                global_batch=8, micro_batches=2, steps=6, lr=3e-3, eval_fraction=0.1, checkpoint_every=2, eval_every=3,
                keep_checkpoints=5, init_checkpoint=pretrained[1].workdir, workdir=workdir,
                mesh=MeshConfig(data=2, fsdp=2, tensor=2), progress=False,
                compilation_cache=str(files["dir"] / "xla_cache"))
    return TrainConfig(**{**base, **kw})


def adapter(workdir):
    state = nnx.state(load(workdir, merge_lora=False, say=None)[0], nnx.LoRAParam)
    return [np.asarray(x) for x in jax.tree.leaves(state)]


@pytest.mark.slow
def test_kill_and_resume_is_bitwise_equal(files, pretrained, tmp_path):
    straight = loop.run(lora_cfg(files, pretrained, str(tmp_path / "a"), export_steps=(3,)))
    killed = loop.run(lora_cfg(files, pretrained, str(tmp_path / "b")), stop_after=3)
    assert killed.stopped_early and killed.model_dir is None
    resumed = loop.run(lora_cfg(files, pretrained, str(tmp_path / "b")))
    assert resumed.step == straight.step == 6
    a, b = adapter(straight.workdir), adapter(resumed.workdir)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    # a finished run started again (e.g. its stage rerun) resumes at its last step and trains nothing more
    again = loop.run(lora_cfg(files, pretrained, str(tmp_path / "a"), export_steps=(3,)))
    assert again.step == 6 and all(np.array_equal(x, y) for x, y in zip(a, adapter(again.workdir)))
    # `export_steps`: the model at step 3 is kept beside the final one, and it is an earlier adapter
    mid = [np.asarray(x) for x in jax.tree.leaves(nnx.state(load(straight.workdir, merge_lora=False, step=3,
                                                                    say=None)[0], nnx.LoRAParam))]
    assert len(mid) == len(a) and not all(np.array_equal(x, y) for x, y in zip(mid, a))
    evals = [json.loads(x) for x in open(straight.metrics_path)]
    evals = {x["step"]: x["loss"] for x in evals if x["kind"] == "eval"}
    assert set(evals) == {0, 3, 6} and evals[6] < evals[0]  # the adapter lowers the held-out span loss
    # the adapter checkpoint holds the adapters only: far smaller than the base
    n_adapter = sum(x.size for x in a)
    n_base = sum(x.size for x in jax.tree.leaves(nnx.state(load(pretrained[1].workdir, say=None)[0], nnx.Param)))
    assert n_adapter < 0.2 * n_base
    from memllm_jax.checkpoint import read_stored

    stored = read_stored(straight.model_dir)  # adapter only, naming the base it was trained on
    assert stored.base == {"source": pretrained[1].workdir, "extra_tokens": 0}
    assert not os.path.exists(os.path.join(straight.model_dir, str(stored.step), "base"))
    # restore the train state written under (2,2,2) into a (8,1,1) mesh: values unchanged
    cfg = lora_cfg(files, pretrained, str(tmp_path / "b"))
    ck = Checkpointer(os.path.join(resumed.workdir, "ckpt"))
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(8, 1, 1), ("data", "fsdp", "tensor"))
    from memllm_jax.train import step as S
    from memllm_jax.train.optimizer import make_optimizer

    split = S.split_model(create_model(TINY, cfg.lora, mesh, 0), "lora")
    tx = make_optimizer(cfg, 6)
    sh = S.train_state_shardings(split, tx, mesh)
    abstract = jax.eval_shape(lambda: S.TrainState(np.int32(0), split.params, tx.init(split.params), split.rngs))
    abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, sh)
    state, data_state = ck.restore(abstract, step=6)
    ck.close()
    assert int(state.step) == 6 and data_state == {"next_index": 6}
    assert all(np.array_equal(np.asarray(x), y) for x, y in zip(jax.tree.leaves(state.params), b))
    assert jax.tree.leaves(state.params)[0].sharding.mesh.shape == mesh.shape


@pytest.mark.slow
def test_resume_refuses_other_settings_and_resume_false_starts_over(files, pretrained, tmp_path):
    from memllm_jax.errors import InputError

    workdir = str(tmp_path / "r")
    loop.run(lora_cfg(files, pretrained, workdir), stop_after=3)
    with pytest.raises(InputError, match=re.escape("lr=0.003 -> 0.001")):  # other settings: refused, named
        loop.run(lora_cfg(files, pretrained, workdir, lr=1e-3))
    with pytest.raises(InputError, match=re.escape("lora.rank=4 -> 8")):
        loop.run(lora_cfg(files, pretrained, workdir, lora=LoraConfig(rank=8, alpha=8.0, dropout=0.1)))
    # how the run is carried out may change: another mesh, micro-batches, logging
    resumed = loop.run(lora_cfg(files, pretrained, workdir, mesh=MeshConfig(data=4, fsdp=2, tensor=1),
                                micro_batches=1, eval_every=2))
    assert resumed.step == 6
    # resume=False starts over and leaves none of the old run's (higher) steps to be kept or resumed instead
    fresh = loop.run(lora_cfg(files, pretrained, workdir, steps=4, lr=1e-3, resume=False))
    assert fresh.step == 4
    assert max(Checkpointer(os.path.join(workdir, "ckpt")).all_steps()) == 4


@pytest.mark.slow
def test_nan_stops_and_keeps_last_good_checkpoint(files, pretrained, tmp_path):
    cfg = lora_cfg(files, pretrained, str(tmp_path / "nan"), lr=1e30, clip_norm=None, checkpoint_every=1,
                   steps=5, async_checkpoint=False)
    with pytest.raises(loop.NonFiniteLoss, match=r"non-finite training loss at step (\d).*Last good checkpoint: step") as info:
        loop.run(cfg)
    bad = int(re.search(r"at step (\d+)", str(info.value)).group(1))
    steps = Checkpointer(os.path.join(cfg.workdir, "ckpt")).all_steps()
    assert steps and max(steps) == bad - 1
    assert not os.path.exists(os.path.join(cfg.workdir, "model"))


@pytest.mark.slow
def test_kept_heap_stops_at_the_first_change_of_batch_shape(files, tmp_path, monkeypatch, capsys):
    """A run whose batches come in two length buckets: at the first step whose batch shape differs from the step
    before, the runtime's hook stops keeping freed memory (`runtime.host_memory`) and says so; with one bucket,
    never."""
    calls = []
    monkeypatch.setattr(host_memory, "_keeping", True)
    libc = types.SimpleNamespace(mallopt=lambda *a: calls.append(a) or 1, malloc_trim=lambda pad: 1)
    monkeypatch.setattr(host_memory, "_libc", lambda: libc)
    monkeypatch.setattr(train_hook, "release_if_memory_low", lambda **kw: False)
    for buckets, name in (((128,), "one"), ((32, 128), "two")):
        cfg = TrainConfig(name=name, model=TINY, mode="full", train_data=(files["write"],), tokenizer=files["tok"],
                          seq_len=128, buckets=buckets, packing="pad", global_batch=8, steps=12, lr=1e-3,
                          eval_fraction=0.05, workdir=str(tmp_path / name), mesh=MeshConfig(data=8, fsdp=1, tensor=1),
                          progress=False)
        assert loop.run(cfg).step == 12
        said = capsys.readouterr().out.count("the batch shape changes (length buckets): freed memory no longer kept")
        assert said == (1 if name == "two" else 0), (name, said)
    assert calls == list(host_memory.GLIBC_DEFAULTS) and host_memory._keeping is False


class Recorder:
    """A training hook that records its calls (a plain class with the four methods, as the runtime's hooks are)."""

    def __init__(self):
        self.calls = []

    def on_start(self, step, say):
        self.calls.append(("start", step))

    def before_step(self, step, batch):
        self.calls.append(("before", step, batch["inputs"].shape[-2:]))

    def on_step(self, step, metrics):
        self.calls.append(("step", step, sorted(k for k in ("loss", "grad_norm") if k in metrics)))

    def on_end(self, step):
        self.calls.append(("end", step))


def test_the_loop_calls_its_hooks_in_order_with_the_step_numbers(files, tmp_path):
    """Each hook: on_start with the steps already done, before_step / on_step with each step's 1-based number,
    on_end with the steps done; a resumed run starts at its checkpoint's step."""
    cfg = TrainConfig(name="hooks", model=TINY, mode="full", train_data=(files["lm"],), tokenizer=files["tok"],
                      seq_len=64, packing="pack", global_batch=8, steps=4, lr=1e-3, eval_fraction=0.05,
                      workdir=str(tmp_path / "hooks"), mesh=MeshConfig(data=8, fsdp=1, tensor=1), progress=False,
                      async_checkpoint=False)
    first, second = Recorder(), Recorder()
    assert loop.run(cfg, stop_after=2, hooks=[first]).step == 2
    assert loop.run(cfg, hooks=[second]).step == 4

    def steps(a, b):
        return [c for s in range(a, b + 1) for c in (("before", s, (8, 64)), ("step", s, ["grad_norm", "loss"]))]

    assert first.calls == [("start", 0), *steps(1, 2), ("end", 2)]
    assert second.calls == [("start", 2), *steps(3, 4), ("end", 4)]
