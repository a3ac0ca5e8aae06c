"""`memllm model-size`: parameter bytes in total and per device for a preset on a mesh (abstract shapes only)."""

from __future__ import annotations

import argparse
import dataclasses
import os

from memllm_jax import options
from memllm_jax.config import PRESETS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="mistral_7b", help=f"model preset: {', '.join(sorted(PRESETS))}")
    parser.add_argument("--mesh", default="1,1,1", help="data,fsdp,tensor sizes, e.g. 1,4,2")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help="parameter dtype override")
    parser.add_argument("--lora-rank", type=options.nonnegative_int, default=0, help="also count LoRA adapters of this rank (0: none)")


def main(args: argparse.Namespace) -> int:
    from memllm_jax.config import parse_mesh

    if args.preset not in PRESETS:
        raise SystemExit(f"--preset {args.preset!r}: choose one of {sorted(PRESETS)}")
    sizes = parse_mesh(args.mesh)
    n_devices = sizes[0] * sizes[1] * sizes[2]
    # Abstract shapes only: fake as many host devices as the mesh needs (nothing is allocated).
    if "jax" not in __import__("sys").modules:
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n_devices}").strip()
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from memllm_jax.config import LoraConfig, MeshConfig
    from memllm_jax.model.placement import param_bytes
    from memllm_jax.sharding import make_mesh

    cfg = PRESETS[args.preset]
    if args.dtype:
        cfg = dataclasses.replace(cfg, param_dtype=args.dtype)
    devices = jax.devices()
    if len(devices) < n_devices:
        raise SystemExit(f"--mesh {args.mesh}: needs {n_devices} devices, jax sees {len(devices)}")
    mesh = make_mesh(MeshConfig(*sizes), devices[:n_devices])
    lora = LoraConfig(rank=args.lora_rank) if args.lora_rank else None
    total, per_device = param_bytes(cfg, lora, mesh)
    gib = 1 << 30
    print(f"preset {args.preset}  mesh data,fsdp,tensor = {args.mesh}  param dtype {cfg.param_dtype}"
          + (f"  LoRA rank {args.lora_rank}" if lora else ""))
    print(f"parameters: {total // jax.numpy.dtype(cfg.param_dtype).itemsize:,}")
    print(f"total bytes: {total:,} ({total / gib:.2f} GiB)")
    print(f"per device (largest shard set): {per_device:,} ({per_device / gib:.2f} GiB)")
    return 0
