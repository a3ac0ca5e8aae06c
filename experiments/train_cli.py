"""`memllm train --config FILE [--part PATH] [--set a.b=c ...] [--point NAME]`: run one training config.

FILE is an experiment config (`experiments/configs/NAME.py` or its module name) whose `get_config()` returns a
`TrainConfig`, or a config holding one at `--part` (e.g. `--config default --part mw`: the main job's memory-write
adapter; give its data with `--set train_data="('write.jsonl',)" --set tokenizer=DIR --set workdir=DIR`);
`--point` applies one named point of its `sweep(add)` first. Every setting is parsed to its field's type and
checked before anything runs.

Multi-process launches: every process runs the same command with `--distributed`, which calls
`jax.distributed.initialize()` before anything touches the devices. On a Cloud TPU pod slice (or under
SLURM, Open MPI, a Kubernetes job) JAX detects the coordinator, the process count and the process id itself;
elsewhere pass them: `--coordinator HOST:PORT --num-processes N --process-id I` (HOST:PORT is process 0's
address), or set `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`. Every process needs the same
config and data files and a shared `workdir` (checkpoints are written by all processes together; metrics,
plots and JSON by process 0).
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from experiments.run import load_config_module, sweep_points
from memllm_jax import runtime
from memllm_jax.settings import check_tree, override
from memllm_jax.train.config import TrainConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="experiment config: a .py file or experiments/configs module name")
    parser.add_argument("--part", default=None, metavar="PATH",
                        help="the training config at this path of the config (e.g. mw, mr, base.pretrain)")
    parser.add_argument("--set", action="append", default=[], metavar="A.B=C",
                        help="change a TrainConfig setting, e.g. steps=100 (repeatable)")
    parser.add_argument("--point", default=None, help="apply this named point of the config's sweep(add)")
    parser.add_argument("--distributed", action="store_true", help="jax.distributed.initialize() first")
    parser.add_argument("--coordinator", metavar="HOST:PORT", help="--distributed: process 0's address "
                        "(default: detected on TPU pods / SLURM / MPI, or env JAX_COORDINATOR_ADDRESS)")
    parser.add_argument("--num-processes", type=int, metavar="N", help="--distributed: the process count")
    parser.add_argument("--process-id", type=int, metavar="I", help="--distributed: this process's id, 0..N-1")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")


def resolve_config(spec: str, assignments: list[str], point: str | None = None, part: str | None = None):
    """The checked `TrainConfig`: the config module's, with `point`'s sweep assignments (to the whole config), the
    part at `part`, then `assignments` (to the training config)."""
    module = load_config_module(spec)
    cfg = module.get_config()
    if point is not None:
        points = dict(sweep_points(module))
        if point not in points:
            raise SystemExit(f"{spec}: no sweep point {point!r} (have {sorted(points)})")
        cfg = override(cfg, *points[point])
    for key in (part.split(".") if part else []):
        if not hasattr(cfg, key):
            raise SystemExit(f"--part {part}: {type(cfg).__name__} has no {key!r}")
        cfg = getattr(cfg, key)
    if not isinstance(cfg, TrainConfig):
        raise SystemExit(f"{spec}: get_config(){'.' + part if part else ''} is a {type(cfg).__name__}, not a "
                         "TrainConfig (choose one with --part, e.g. --part mw)")
    cfg = override(cfg, *assignments)
    check_tree(cfg)
    return cfg


def main(args: argparse.Namespace) -> int:
    if runtime.keep_freed_memory_default():
        runtime.keep_freed_memory()  # before JAX starts: the steps reuse their temporary buffers' pages
    explicit = (args.coordinator, args.num_processes, args.process_id)
    if any(x is not None for x in explicit) and not args.distributed:
        raise SystemExit("--coordinator / --num-processes / --process-id: only with --distributed")
    if args.distributed:
        from memllm_jax.train.loop import initialize_distributed

        initialize_distributed(*explicit)
    cfg = resolve_config(args.config, args.set, args.point, args.part)
    if args.print_config:
        print(json.dumps(dataclasses.asdict(cfg), indent=1))
        return 0
    from memllm_jax.train.loop import NonFiniteLoss, run

    try:
        result = run(cfg)
    except NonFiniteLoss as exc:
        print(f"error: {exc}")
        return 3
    print(json.dumps(result.to_dict(), indent=1))
    return 0
