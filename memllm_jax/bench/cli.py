"""`memllm bench NAME`: benchmarks printing ratios against a named peer, measured side by side in one run.

Every benchmark first samples the host (`bench.host`): when other processes keep it busy it refuses (exit 2)
unless `--allow-load`; under its table it prints the date and the host's load before and during the run.
"""

from __future__ import annotations

import argparse
import importlib
import sys

BENCHES = {
    "model": "memllm_jax.bench.model",
    "memory": "memllm_jax.bench.memory",
    "train": "memllm_jax.bench.train",
    "decode": "memllm_jax.bench.decode",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", choices=sorted(BENCHES), help="which benchmark")
    parser.add_argument("rest", nargs=argparse.REMAINDER,
                        help="options of that benchmark (see memllm bench NAME --help), and --allow-load")


def main(args: argparse.Namespace) -> int:
    from memllm_jax.bench import host

    module = importlib.import_module(BENCHES[args.name])
    parser = argparse.ArgumentParser(prog=f"memllm bench {args.name}", description=module.__doc__)
    parser.add_argument("--allow-load", action="store_true", help="run even when the host is busy (figures are noisy)")
    module.add_arguments(parser)
    bench_args = parser.parse_args(args.rest)
    before = host.sample()
    if not host.check_idle(before, bench_args.allow_load):
        print(f"error: memllm bench {args.name}: the host is busy; rerun when it is idle, or pass --allow-load to "
              "measure anyway", file=sys.stderr)
        return 2
    result = int(module.main(bench_args) or 0)
    after = host.sample(since=before)
    print("\n" + host.host_line(before, after), flush=True)
    host.warn_if_disturbed(after)
    return result
