"""One process of `test_distributed.py`: trains the TINY model a few full-parameter steps on a (2, 4, 1) mesh
of 8 fake CPU devices spread over `n_processes` processes, feeding only its own rows, and (process 0) saves
the losses and the final parameters.

Usage: python distributed_worker.py N_PROCESSES PROCESS_ID PORT OUT.npz
"""

import os
import sys

n_processes, process_id, port, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={8 // n_processes}"

import jax  # noqa: E402

jax.config.update("jax_cpu_collectives_implementation", "gloo")
if n_processes > 1:
    jax.distributed.initialize(f"localhost:{port}", num_processes=n_processes, process_id=process_id)

import dataclasses  # noqa: E402

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.experimental import multihost_utils  # noqa: E402

from memllm_jax.bench.train import _batch  # noqa: E402
from memllm_jax.config import TINY, MeshConfig  # noqa: E402
from memllm_jax.model.placement import create_sharded_model  # noqa: E402
from memllm_jax.sharding import make_mesh  # noqa: E402
from memllm_jax.train import step as S  # noqa: E402
from memllm_jax.train.config import TrainConfig  # noqa: E402
from memllm_jax.train.optimizer import make_optimizer  # noqa: E402

ROWS, LENGTH, STEPS = 8, 32, 3
cfg = dataclasses.replace(TINY, n_layers=2, max_seq_len=LENGTH)
mesh = make_mesh(MeshConfig(2, 4, 1))
split = S.split_model(create_sharded_model(cfg, None, mesh, seed=0), "full")
# Adam's eps well above the float32 noise of differently ordered reductions: with the default 1e-8, a
# near-zero gradient's sign flip between runs becomes a whole lr-sized step for that parameter.
tx = make_optimizer(TrainConfig(train_data=("-",), tokenizer="-", lr=1e-2, warmup_steps=0, eps=1e-3), STEPS)
shardings = S.train_state_shardings(split, tx, mesh)
state = S.init_train_state(split, tx, shardings)
train_step = S.make_train_step(split, tx, mesh, shardings)
mine = slice(process_id * ROWS // n_processes, (process_id + 1) * ROWS // n_processes)
losses = []
for i in range(STEPS):
    batch = _batch(cfg, ROWS, LENGTH, seed=i)
    local = {k: v[None, mine] for k, v in batch.items()}
    state, metrics = train_step(state, split.frozen, S.to_global(local, mesh))
    losses.append(float(metrics["loss"]))
params = multihost_utils.process_allgather(nnx.to_pure_dict(state.params), tiled=True)  # the global arrays
if process_id == 0:
    flat = {jax.tree_util.keystr(path): np.asarray(v) for path, v in jax.tree_util.tree_leaves_with_path(params)}
    np.savez(out, losses=np.asarray(losses), **flat)
