"""`memllm run`: the embedded-default main job, any experiment config, or a sweep.

    memllm run --out outputs/default                       # experiments/configs/default.py, every stage
    memllm run --config experiments/configs/table2.py --out DIR [--set "table2.rows=('row7',)"] [--sweep]
    memllm run --out DIR --stage table2 [--force]          # one stage (its inputs must exist)
    memllm run --config smollm2_redocred --print-config    # the resolved settings tree

A config file's `get_config()` returns a `PipelineConfig`; `sweep(add)` calls `add(name, *assignments)` once
per point. Every setting (and every sweep point's) is parsed to its field's type and checked before anything
runs or is written. Sweep points share the output directory (stages whose settings did not change are skipped, so
models are trained once) and each point's results are copied to `DIR/sweep/<name>/`.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import pathlib
import json
import shutil
import sys
import time
from typing import Any

from experiments.pipeline import Pipeline
from experiments.pipeline_config import STAGES, PipelineConfig, check_config
from memllm_jax import runtime
from memllm_jax.settings import override


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default="default", help="experiments/configs module name or a .py file (default: default)")
    parser.add_argument("--out", default="outputs/default", help="output directory for every artefact")
    parser.add_argument("--set", action="append", default=[], metavar="A.B=V",
                        help="change a setting, e.g. mw.steps=200 (repeatable; see --print-config)")
    parser.add_argument("--sweep", action="store_true", help="run every point of the config's sweep(add)")
    parser.add_argument("--stage", action="append", default=[], help="run only these stages (repeatable)")
    parser.add_argument("--force", action="store_true", help="rerun the selected stages even when up to date")
    parser.add_argument("--print-config", action="store_true", help="print the resolved settings tree and exit")
    parser.add_argument("--dry-run", action="store_true",
                        help="check every input, print each stage's work and the training steps' AOT memory plans, "
                             "then exit (nothing is trained or written)")
    parser.add_argument("--devices", type=int, default=8,
                        help="--dry-run without an accelerator: plan on this many fake host devices")


def load_config_module(spec: str):
    path = pathlib.Path(spec)
    if spec.endswith(".py") or path.exists():
        if not path.exists():
            raise SystemExit(f"{spec}: config file not found")
        mod_spec = importlib.util.spec_from_file_location(f"memllm_config_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        mod_spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(f"experiments.configs.{spec}")
    except ModuleNotFoundError as exc:
        if exc.name not in (f"experiments.configs.{spec}", "experiments.configs", "experiments"):
            raise  # the config imports something missing: a bug or an environment problem, not a bad name
        raise SystemExit(f"{spec}: no such experiment config (experiments/configs/{spec}.py)") from exc


def sweep_points(module) -> list[tuple[str, tuple[str, ...]]]:
    points: list[tuple[str, tuple[str, ...]]] = []
    if not hasattr(module, "sweep"):
        raise SystemExit(f"{module.__name__}: has no sweep(add)")
    module.sweep(lambda name, *assignments: points.append((str(name), tuple(assignments))))
    return points


def resolve(args: argparse.Namespace) -> tuple[Any, list[tuple[str, Any]]]:
    """The config module and its points `(name, PipelineConfig)` (one unnamed point without `--sweep`), every
    setting parsed and checked: a bad one is an `InputError` before anything runs."""
    module = load_config_module(args.config)
    base = module.get_config()
    if not isinstance(base, PipelineConfig):
        raise SystemExit(f"{args.config}: get_config() returned {type(base).__name__}; `memllm run` takes a PipelineConfig "
                         "(training configs run with `memllm train`)")
    base = override(base, *args.set)
    points = []
    for name, assignments in (sweep_points(module) if args.sweep else [("", ())]):
        cfg = override(base, *assignments)
        # files are checked when a run starts; a dry run lists every missing one, printing needs none
        check_config(cfg, files=not (getattr(args, "dry_run", False) or getattr(args, "print_config", False)))
        points.append((name, cfg))
    return module, points


def main(args: argparse.Namespace) -> int:
    stages = tuple(args.stage) or tuple(STAGES)
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise SystemExit(f"--stage: unknown stage(s) {bad}; stages: {', '.join(STAGES)}")
    _, points = resolve(args)
    if args.print_config:
        for name, cfg in points:
            print(json.dumps({"point": name, **dataclasses.asdict(cfg)} if name else dataclasses.asdict(cfg), indent=1))
        return 0
    if args.dry_run:
        from memllm_jax.plan_cli import ensure_host_devices

        ensure_host_devices(args.devices)  # compiles on fake host devices: set up before jax starts
        from experiments import dry_run

        return max(dry_run.dry_run(cfg, args.devices) for _, cfg in points)
    if runtime.keep_freed_memory_default():
        runtime.keep_freed_memory()  # before JAX starts: the training and decoding steps reuse their buffers' pages
    out = pathlib.Path(args.out)
    t0 = time.perf_counter()

    def say(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f}s] {msg}", flush=True)

    for name, cfg in points:
        if name:
            say(f"=== sweep point {name}")
        pipe = Pipeline(cfg, out, say)
        if args.force:
            for s in stages:
                pipe.run_stage(s, force=True)
        else:
            pipe.run(stages)
        if name and (out / "results").exists():
            dest = out / "sweep" / name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(out / "results", dest)
    say(f"all done; artefacts in {out}")
    return 0


if __name__ == "__main__":
    _parser = argparse.ArgumentParser(prog="memllm run")
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
