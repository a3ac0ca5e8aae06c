"""`memllm plan`: compile the train step (and a one-token decode step) ahead of time for a preset on a mesh
and print XLA's per-device memory (arguments, temporaries, outputs), FLOPs, compile time and which
accelerators it fits. Nothing is allocated: parameters, optimizer state, batch and cache are
`ShapeDtypeStruct`s carrying their shardings. Without enough real devices the mesh is made of fake host
(CPU) devices: the command sets `--xla_force_host_platform_device_count` before jax is imported, so run it
as its own process (`memllm plan ...`), not after jax has started.

XLA:CPU computes bfloat16 matmuls in float32 (it inserts converts), so bf16 temporaries measured on host
devices overstate what a TPU or GPU compile needs; treat the figures as an upper bound there.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time

CHIPS_GIB: dict[str, float] = {"v5e": 16, "v4": 32, "H100": 80, "v5p": 95}
"""Memory per device of the accelerators the plan is checked against (GiB of HBM)."""

GIB = 1 << 30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="mistral_7b", help="model preset (memllm_jax.config.PRESETS)")
    parser.add_argument("--mesh", default="1,8,1", help="data,fsdp,tensor sizes, e.g. 1,8,1")
    parser.add_argument("--batch", type=int, default=8, help="global rows per optimizer step")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per row (and decode cache slots)")
    parser.add_argument("--layers", type=int, default=None, help="override the preset's depth")
    parser.add_argument("--lora-rank", type=int, default=16, help="LoRA rank on every target + lm_head; 0 = full fine-tuning")
    parser.add_argument("--trainable-tokens", type=int, default=None,
                        help="added API-marker rows trained with the adapter (default: protocol.MARKERS)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="params and compute")
    parser.add_argument("--remat-policy", default="nothing_saveable", help="jax.checkpoint_policies name")
    parser.add_argument("--no-remat", action="store_true", help="keep every activation for the backward pass")
    parser.add_argument("--scan", choices=("on", "off", "preset"), default="preset",
                        help="ModelConfig.scan_layers (default: the preset's)")
    parser.add_argument("--micro-batches", type=int, default=1, help="TrainConfig.micro_batches")
    parser.add_argument("--no-decode", action="store_true", help="plan the train step only")


def ensure_host_devices(n: int) -> None:
    """Make jax see at least `n` devices: fake host devices when it has not been imported yet."""
    import os
    import sys

    if "jax" not in sys.modules:
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
    import jax

    if len(jax.devices()) < n and len(jax.devices("cpu")) < n:
        raise SystemExit(f"the mesh needs {n} devices but jax sees {len(jax.devices())} (jax was imported before "
                         f"`memllm plan` could fake host devices: run it as its own process)")


def _devices(n: int):
    import jax

    return jax.devices()[:n] if len(jax.devices()) >= n else jax.devices("cpu")[:n]


@dataclasses.dataclass(frozen=True)
class Plan:
    """XLA's figures for one compiled function, per device."""

    name: str
    compile_s: float
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temp_bytes: int
    flops: float

    @property
    def peak_bytes(self) -> int:
        """Live at once at the worst point: inputs + temporaries + outputs not written over (donated) inputs."""
        return self.argument_bytes + self.temp_bytes + self.output_bytes - self.alias_bytes


def _plan(name: str, lowered_fn, *args) -> Plan:
    t0 = time.perf_counter()
    compiled = lowered_fn.lower(*args).compile()
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return Plan(name, seconds, mem.argument_size_in_bytes, mem.output_size_in_bytes, mem.alias_size_in_bytes,
                mem.temp_size_in_bytes, float((cost or {}).get("flops", float("nan"))))


def _abstract(tree, shardings):
    import jax

    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def plan_train(cfg, lora, mesh, batch: int, seq_len: int, micro_batches: int = 1) -> Plan:
    """Compile the train step (`train.step.make_train_step`, AdamW with clipping) on abstract inputs."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from memllm_jax.model.placement import abstract_model
    from memllm_jax.sharding import state_shardings
    from memllm_jax.train import step as S
    from memllm_jax.train.config import TrainConfig
    from memllm_jax.train.optimizer import make_optimizer

    graphdef, state = abstract_model(cfg, lora, mesh)
    split = S.split_model(nnx.merge(graphdef, state), "lora" if lora is not None else "full")
    tx = make_optimizer(TrainConfig(train_data=("-",), tokenizer="-"), 1000)
    shardings = S.train_state_shardings(split, tx, mesh)
    train_state = jax.eval_shape(lambda p, r: S.TrainState(jnp.zeros((), jnp.int32), p, tx.init(p), r),
                                 split.params, split.rngs)
    train_state = _abstract(train_state, shardings)
    frozen = _abstract(split.frozen, state_shardings(split.frozen, mesh))
    shape = (micro_batches, batch // micro_batches, seq_len)
    dtypes = {"loss_mask": jnp.bool_, "attn_mask": jnp.bool_}
    sh = S.batch_sharding(mesh)
    batch_in = {k: jax.ShapeDtypeStruct(shape, dtypes.get(k, jnp.int32), sharding=sh) for k in S.BATCH_FIELDS}
    step = S.make_train_step(split, tx, mesh, shardings)
    with jax.set_mesh(mesh):
        return _plan("train step", step.jitted, train_state, frozen, batch_in)


def plan_decode(cfg, lora, mesh, batch: int, cache_len: int) -> Plan:
    """Compile one decode step: a one-token forward over a `cache_len`-slot KV cache in the form the decode
    loops carry (stacked for scanned layers, else per layer: `decode.graph.layered`), the cache donated."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from memllm_jax.model.decoder import KVCache, init_cache
    from memllm_jax.model.placement import abstract_model, cache_shardings
    from memllm_jax.sharding import batch_sharding, row_sharding

    graphdef, state = abstract_model(cfg, lora, mesh)
    cache = jax.eval_shape(lambda: init_cache(cfg, batch, cache_len))
    cache_sh = cache_shardings(cfg, mesh, batch, cache_len)
    def loop_form(x, sharding):  # stacked, or a tuple of per-layer arrays
        if cfg.scan_layers:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
        return tuple(jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=row_sharding(sharding))
                     for _ in range(cfg.n_layers))

    cache = KVCache(loop_form(cache.k_LxBxKxHxS, cache_sh.k_LxBxKxHxS), loop_form(cache.v_LxBxKxSxH, cache_sh.v_LxBxKxSxH),
                    jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=cache_sh.lengths_B))
    tokens = jax.ShapeDtypeStruct((batch, 1), jnp.int32, sharding=batch_sharding(mesh))

    def decode(state, cache, tokens_Bx1):
        model = nnx.merge(graphdef, state)
        return model(tokens_Bx1, cache.lengths_B[:, None], cache=cache)

    with jax.set_mesh(mesh):
        return _plan("decode step", jax.jit(decode, donate_argnums=1), state, cache, tokens)


def model_flops(cfg, lora, rows: int, seq_len: int) -> float:
    """The LoRA train step's FLOPs counted from the model's shapes (`bench.train.step_flops`); NaN otherwise.
    Needed because XLA's cost analysis counts the body of a loop once, so under scan it misses n_layers - 1
    layers."""
    from memllm_jax.bench.train import step_flops

    return float("nan") if lora is None else step_flops(cfg, lora.rank, lora.targets, rows, seq_len)


def _gib(n: float) -> str:
    return f"{n / GIB:.2f}"


def fits(plan: Plan) -> dict[str, bool]:
    return {chip: plan.peak_bytes <= gib * GIB for chip, gib in CHIPS_GIB.items()}


def model_configs(args: argparse.Namespace):
    """`(ModelConfig, LoraConfig | None)` from the command line."""
    from memllm_jax import protocol
    from memllm_jax.config import PRESETS, LoraConfig

    if args.preset not in PRESETS:
        raise SystemExit(f"--preset {args.preset!r}: choose one of {sorted(PRESETS)}")
    cfg = PRESETS[args.preset]
    markers = len(protocol.MARKERS) if args.trainable_tokens is None else args.trainable_tokens
    scan = {"on": True, "off": False, "preset": cfg.scan_layers}[args.scan]
    cfg = dataclasses.replace(
        cfg, n_layers=args.layers or cfg.n_layers, param_dtype=args.dtype, compute_dtype=args.dtype,
        remat=not args.no_remat, remat_policy=args.remat_policy, scan_layers=scan,
        max_seq_len=max(cfg.max_seq_len, args.seq_len), vocab_size=cfg.vocab_size + (markers if args.lora_rank else 0),
    )
    lora = None
    if args.lora_rank:
        new_rows = tuple(range(cfg.vocab_size - markers, cfg.vocab_size))
        lora = LoraConfig(rank=args.lora_rank, alpha=8.0, dropout=0.1, trainable_tokens=new_rows)
    return cfg, lora


def main(args: argparse.Namespace) -> int:
    from memllm_jax.config import parse_mesh

    sizes = parse_mesh(args.mesh)
    rows_per_step = sizes[0] * sizes[1] * args.micro_batches
    if args.batch % rows_per_step:
        raise SystemExit(f"--batch {args.batch} is not divisible by data*fsdp*micro-batches = {rows_per_step}")
    ensure_host_devices(math.prod(sizes))
    from memllm_jax.config import MeshConfig
    from memllm_jax.sharding import make_mesh

    cfg, lora = model_configs(args)
    mesh = make_mesh(MeshConfig(*sizes), _devices(math.prod(sizes)))
    platform = mesh.devices.flat[0].platform
    print(f"plan: preset {args.preset}, {cfg.n_layers} layers ({'scan' if cfg.scan_layers else 'unrolled'}), "
          f"{cfg.param_dtype}, remat {'off' if not cfg.remat else cfg.remat_policy}, "
          + (f"LoRA r{lora.rank} on {','.join(lora.targets)} + {len(lora.trainable_tokens)} token rows"
             if lora else "full fine-tuning")
          + f"; mesh data,fsdp,tensor = {args.mesh} on {math.prod(sizes)} {platform} devices; batch {args.batch} x "
          f"{args.seq_len} tokens in {args.micro_batches} micro-batch(es), "
          f"{args.batch // rows_per_step} row(s) per device per micro-batch")
    plans = [plan_train(cfg, lora, mesh, args.batch, args.seq_len, args.micro_batches)]
    if not args.no_decode:
        plans.append(plan_decode(cfg, lora, mesh, args.batch, args.seq_len))
    chips = list(CHIPS_GIB)
    counted = [model_flops(cfg, lora, args.batch, args.seq_len) / math.prod(sizes), float("nan")]
    print("\n| step | compile s | args GiB | temp GiB | out GiB | peak GiB | XLA GFLOP/dev | model GFLOP/dev | "
          + " | ".join(f"{c} {CHIPS_GIB[c]:g}G" for c in chips) + " |")
    print("|---" * (8 + len(chips)) + "|")
    for p, model in zip(plans, counted):
        ok = fits(p)
        print(f"| {p.name} | {p.compile_s:.1f} | {_gib(p.argument_bytes)} | {_gib(p.temp_bytes)} | "
              f"{_gib(p.output_bytes)} | {_gib(p.peak_bytes)} | {p.flops / 1e9:,.0f} | "
              + ("-" if math.isnan(model) else f"{model / 1e9:,.0f}") + " | "
              + " | ".join("fits" if ok[c] else "no" for c in chips) + " |")
    print("\npeak = args + temp + out - aliased (donated) bytes, per device. XLA GFLOP: its cost analysis, which "
          "counts a loop body once (under scan: one layer); model GFLOP: counted from the shapes (LoRA step).")
    if platform == "cpu" and cfg.compute_dtype == "bfloat16":
        print("host (CPU) devices: XLA:CPU runs bf16 matmuls in float32, so temp is an upper bound for TPU/GPU.")
    train = plans[0]
    if not all(fits(train).values()):
        rows = args.batch // rows_per_step
        options = [m for m in (2, 4, 8, 16) if rows % m == 0]
        missing = [c for c, ok in fits(train).items() if not ok]
        hint = (f"try --micro-batches {args.micro_batches * options[0]} (TrainConfig.micro_batches): "
                f"activation temporaries scale with the rows per micro-batch" if options else
                "one row per device already: shard wider (--mesh), shorten --seq-len or use a stronger --remat-policy")
        print(f"does not fit {', '.join(missing)}: {hint}.")
    return 0
