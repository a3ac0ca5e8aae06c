"""`memllm eval {table2,editing,scaling,two_hop} --out DIR`: rerun one evaluation of a pipeline output directory
(the stages before it must have run, e.g. with `memllm run --out DIR`)."""

from __future__ import annotations

import argparse
import pathlib


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("table2", "editing", "scaling", "two_hop"), help="which evaluation")
    parser.add_argument("--out", required=True, help="pipeline output directory")
    parser.add_argument("--config", default="default", help="experiments/configs module or .py file")
    parser.add_argument("--set", action="append", default=[], metavar="A.B=V",
                        help="change a setting, e.g. table2.rows=\"('row7',)\" (repeatable; checked before anything runs)")


def main(args: argparse.Namespace) -> int:
    from experiments import run

    if not pathlib.Path(args.out).is_dir():  # checked before the config loads and the evaluation starts
        raise SystemExit(f"--out {args.out}: no pipeline output directory there (run `memllm run --out {args.out}` "
                         f"first)")
    ns = argparse.Namespace(config=args.config, out=args.out, set=args.set, sweep=False, stage=[args.what, "report"],
                            force=True, print_config=False, dry_run=False)
    return run.main(ns)
