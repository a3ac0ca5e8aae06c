"""`memllm bench NAME`: benchmarks printing ratios against a named peer, measured side by side in one run."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "model": "memllm_jax.bench.model",
    "memory": "memllm_jax.bench.memory",
    "train": "memllm_jax.bench.train",
    "decode": "memllm_jax.bench.decode",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(BENCHES), help="which benchmark")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="options of that benchmark (see memllm bench NAME --help)")


def main(args: argparse.Namespace) -> int:
    module = importlib.import_module(BENCHES[args.name])
    parser = argparse.ArgumentParser(prog=f"memllm bench {args.name}", description=module.__doc__)
    module.add_arguments(parser)
    return int(module.main(parser.parse_args(args.rest)) or 0)
