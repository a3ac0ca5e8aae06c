"""`memllm train --distributed` end to end: two local processes x 4 fake CPU devices (gloo collectives), each
running the real CLI, train like one process x 8 devices - the same losses per step (metrics.jsonl), held-out
loss and final model; the Orbax train-state checkpoint the two processes wrote together restores in one
process and equals the single-process one; and each process materialised only its own rows of every batch."""

import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import numpy as np
import portpicker
import pytest
from flax import nnx

from memllm_jax.config import LoraConfig, MeshConfig, ModelConfig
from memllm_jax.train.config import TrainConfig
from tests.support.train_fixtures import make_tokenizer, write_jsonl, write_records

TESTS = pathlib.Path(__file__).parent
RECORDER = TESTS / "cli_recorder.py"
TIMEOUT_S = 300
STEPS = 4

# One worker runs the module (`--dist loadgroup`): its two-process runs are made once, not once per worker.
pytestmark = pytest.mark.xdist_group("distributed_cli")

CONFIG = '''
from memllm_jax.config import TINY, MeshConfig
from memllm_jax.train.config import TrainConfig


def get_config():
    # Adam's eps well above float32 noise (see distributed_worker.py): differently ordered reductions must not
    # flip a near-zero gradient into a whole lr-sized step
    return TrainConfig(name="dist", model=TINY, mode="full", train_data=({data!r},), tokenizer={tok!r},
                       seq_len=128, buckets=(128,), packing="pad", global_batch=16, micro_batches=2,
                       steps={steps}, lr=1e-2, warmup_steps=0, eps=1e-3, eval_fraction=0.1, eval_batch=8,
                       log_every=1, checkpoint_every=2, keep_checkpoints=5, mesh=MeshConfig(2, 4, 1),
                       progress=False)
'''


def launch(argvs: list[list[str]], devices: int, envs: list[dict] | None = None) -> list[str]:
    """Run the commands as simultaneous processes with `devices` fake CPU devices each (and `envs[i]` added to
    process i's environment); their outputs. Every process is reaped, also on a timeout or a failed peer."""
    env = {**os.environ, "PYTHONPATH": str(TESTS.parents[1]), "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    for k in ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        env.pop(k, None)
    envs = envs or [{} for _ in argvs]
    procs = [subprocess.Popen(argv, env={**env, **extra}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for argv, extra in zip(argvs, envs)]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        logs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0].decode(errors="replace")
                for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return logs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    make_tokenizer(d / "tok")
    data = write_jsonl(d / "w.jsonl", write_records(120))
    config = d / "cfg.py"
    config.write_text(CONFIG.format(data=data, tok=str(d / "tok"), steps=STEPS))
    port = portpicker.pick_unused_port()

    def train(tag: str, k: int, *extra: str) -> list[str]:
        return [sys.executable, str(RECORDER), str(d / f"batches_{tag}{k}.npz"), "train", "--config", str(config),
                "--set", f"workdir={d / tag}", *extra]

    t0 = time.perf_counter()
    # process 0 gets the coordinator, count and id as flags, process 1 from the environment
    two = launch([train("two", 0, "--distributed", "--coordinator", f"localhost:{port}", "--num-processes", "2",
                        "--process-id", "0"), train("two", 1, "--distributed")], devices=4,
                 envs=[{}, {"JAX_COORDINATOR_ADDRESS": f"localhost:{port}", "JAX_NUM_PROCESSES": "2",
                            "JAX_PROCESS_ID": "1"}])
    t1 = time.perf_counter()
    one = launch([train("one", 0)], devices=8)
    print(f"2 processes: {t1 - t0:.0f}s, 1 process: {time.perf_counter() - t1:.0f}s")
    return {"dir": d, "logs_two": two, "logs_one": one}


def _result(log: str) -> dict:
    return json.loads(log[log.index("{\n"):])


def _metrics(workdir: pathlib.Path, kind: str) -> list[dict]:
    return [r for r in map(json.loads, open(workdir / "metrics.jsonl")) if r["kind"] == kind]


@pytest.mark.slow
def test_two_processes_train_like_one(runs):
    d = runs["dir"]
    results = [_result(log) for log in runs["logs_two"] + runs["logs_one"]]
    assert [r["step"] for r in results] == [STEPS] * 3
    train_two, train_one = _metrics(d / "two", "train"), _metrics(d / "one", "train")
    assert [r["step"] for r in train_two] == [r["step"] for r in train_one] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r["loss"] for r in train_two], [r["loss"] for r in train_one], rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in train_two], [r["grad_norm"] for r in train_one], rtol=1e-4)
    eval_two, eval_one = _metrics(d / "two", "eval"), _metrics(d / "one", "eval")
    assert len(eval_one) == 1 and eval_one[0]["loss_tokens"] == eval_two[0]["loss_tokens"] > 0
    np.testing.assert_allclose(eval_two[0]["loss"], eval_one[0]["loss"], rtol=1e-5)
    assert train_one[-1]["loss"] < train_one[0]["loss"]

    from memllm_jax.model.load import load

    final_two = nnx.to_flat_state(nnx.state(load(d / "two", say=None)[0], nnx.Param))
    final_one = nnx.to_flat_state(nnx.state(load(d / "one", say=None)[0], nnx.Param))
    assert [p for p, _ in final_two] == [p for p, _ in final_one] and len(final_one) > 10
    for (path, a), (_, b) in zip(final_two, final_one):
        np.testing.assert_allclose(np.asarray(a.get_value()), np.asarray(b.get_value()), atol=1e-5, err_msg=str(path))
    assert (d / "two" / "model" / "tokenizer").is_dir()


def _restore(workdir: pathlib.Path, step: int):
    """The train state of `workdir/ckpt` at `step`, restored in this single process (8 devices) into the
    shardings of a freshly built state."""
    from memllm_jax.sharding import make_mesh
    from memllm_jax.train import loop
    from memllm_jax.train import step as S
    from memllm_jax.train.checkpoint import Checkpointer
    from memllm_jax.train.optimizer import make_optimizer

    cfg = _config_from_json(json.loads((workdir / "train_config.json").read_text()))
    mesh = make_mesh(cfg.mesh)
    split = S.split_model(loop.initial_model(cfg, mesh, None), cfg.mode)
    tx = make_optimizer(cfg, STEPS)
    state = S.init_train_state(split, tx, S.train_state_shardings(split, tx, mesh))
    ckpt = Checkpointer(str(workdir / "ckpt"), async_save=False)
    try:
        assert ckpt.all_steps() == [2, STEPS]
        return ckpt.restore(loop._abstract(state), step)
    finally:
        ckpt.close()


@pytest.mark.slow
def test_two_process_checkpoint_restores_in_one_process(runs):
    d = runs["dir"]
    for step in (2, STEPS):
        (two, data_two), (one, data_one) = _restore(d / "two", step), _restore(d / "one", step)
        assert data_two == data_one and data_one  # the grain iterator position
        assert int(two.step) == step
        leaves_two, leaves_one = jax.tree_util.tree_leaves_with_path(two), jax.tree_util.tree_leaves_with_path(one)
        assert len(leaves_two) == len(leaves_one) > 10
        for (path, a), (_, b) in zip(leaves_two, leaves_one):
            if jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key):
                a, b = jax.random.key_data(a), jax.random.key_data(b)
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, err_msg=jax.tree_util.keystr(path))
    from memllm_jax.model.load import load

    final = dict(nnx.to_flat_state(nnx.state(load(d / "two", say=None)[0], nnx.Param)))
    restored = dict(nnx.to_flat_state(two.params))
    assert restored.keys() <= final.keys() and restored
    for path, v in restored.items():  # the last checkpoint holds the exported model's parameters
        np.testing.assert_array_equal(np.asarray(v.get_value()), np.asarray(final[path].get_value()))


@pytest.mark.slow
def test_each_process_materialised_only_its_rows(runs):
    d = runs["dir"]
    one = np.load(d / "batches_one0.npz")
    parts = [np.load(d / f"batches_two{k}.npz") for k in range(2)]
    keys = sorted(one.files)
    assert keys == sorted(parts[0].files) == sorted(parts[1].files)
    assert {k.split("/")[1] for k in keys} == {str(i) for i in range(STEPS)}
    assert {"inputs/0", "loss_mask/0", "head_index/0"} <= set(keys)
    for key in keys:
        full = one[key]  # [micro_batches, rows, ...]: the whole global batch
        rows = full.shape[1] // 2
        assert parts[0][key].shape[1] == parts[1][key].shape[1] == rows
        np.testing.assert_array_equal(parts[0][key], full[:, :rows], err_msg=key)
        np.testing.assert_array_equal(parts[1][key], full[:, rows:], err_msg=key)
    assert not np.array_equal(parts[0]["inputs/0"], parts[1]["inputs/0"])


def _config_from_json(d: dict) -> TrainConfig:
    """The `TrainConfig` a run saved as `train_config.json` (`dataclasses.asdict`)."""
    d = dict(d)
    d["model"] = ModelConfig(**{"scan_layers": False, **d["model"]})  # runs from before the field: unrolled
    d["lora"] = LoraConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in d["lora"].items()}) if d.get("lora") else None
    d["mesh"] = MeshConfig(**d["mesh"])
    for k in ("train_data", "eval_data", "buckets", "export_steps"):
        d[k] = tuple(d.get(k) or ())
    return TrainConfig(**d)
