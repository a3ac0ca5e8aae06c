"""`memllm bench train`: tokens/s and achieved FLOP/s of one LoRA training step (our jitted step) next to
HF transformers + PEFT (torch, eager attention) doing the same step - same model config, LoRA targets and
rank, batch, sequence length, AdamW with clipping - timed interleaved in one run (A B A B ...), and next to
this machine's measured matmul ceiling (`bench.ceiling`: best of sizes, jax and torch, the step's dtypes).
Each contender runs in its own worker process (`bench.workers`; `--same-process`: all in this one), so what one
keeps in its process (malloc heap, torch's allocator and threads) is not there when the other runs.

FLOPs counted per step (frozen base, so no weight gradients for it): forward 2*N*T, input gradients 2*N*T,
attention scores and values 2*2*B*L^2*(heads*head_dim) per layer forward and twice that backward, and
6*N_lora*T for the adapters, with N the base matmul parameters (embedding lookup excluded) and T = B*L; the LM
head (d_model x vocab, and its adapter) counts at the loss positions only, the logits the loss needs, for every
contender (ours computes only those by default: `TrainConfig.sparse_head`; HF computes all).
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import numpy as np

from memllm_jax.bench import ceiling, roofline
from memllm_jax.bench.model import hf_mistral_config
from memllm_jax.bench.timing import interleaved, markdown_table, ratio_row, samples_line
from memllm_jax.bench.workers import Spec, interleaved_in_workers
from memllm_jax.runtime.host_memory import keep_freed_memory

OMP_PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
"""`--omp-passive`: torch's OpenMP threads sleep at once when they wait instead of spinning first. Not the
default: an idle worker does not spin either way (measured: no CPU time in the 0.5 s after a step), and it
changes the peer's own step time (much faster under CPU load, a little slower on an idle host: docs/train.md)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="small", help="model preset (memllm_jax.config.PRESETS); d_model >= 512")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--trainable-tokens", type=int, default=0,
                        help="also train this many embedding rows (the last ids, as for API markers appended to a "
                             "pretrained vocabulary; 10 in the memory-write / memory-read configs): ours "
                             "LoraConfig.trainable_tokens, PEFT trainable_token_indices")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--matmul-dtype", choices=("float32", "bfloat16"), default=None,
                        help="operand dtype of the linear layers' matmuls (ModelConfig.matmul_dtype; default: the "
                             "preset's); HF + PEFT then runs under torch.autocast to the same dtype")
    parser.add_argument("--matmul-sizes", default="512,1024,2048", help="sizes n of the n x n x n ceiling matmuls")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = os.cpu_count())")
    parser.add_argument("--no-peer", action="store_true", help="skip HF + PEFT")
    parser.add_argument("--full-head", action="store_true",
                        help="also time our step with logits at every position (TrainConfig.sparse_head=False)")
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc malloc as it is, as a process that does not call "
                             "runtime.host_memory.keep_freed_memory (as `memllm train` does on a CPU host) runs")
    parser.add_argument("--omp-passive", action="store_true",
                        help="set OMP_WAIT_POLICY=PASSIVE for torch (hf+peft): its OpenMP threads sleep instead of "
                             "spinning while they wait (under CPU load, with --allow-load, the default spinning "
                             "slowed the torch step several-fold)")
    parser.add_argument("--peer-keeps-freed-memory", action="store_true",
                        help="give HF + PEFT's worker the same malloc setting as ours "
                             "(runtime.host_memory.keep_freed_memory); by default it runs with glibc's defaults")
    parser.add_argument("--same-process", action="store_true",
                        help="run every contender in this one process (the old way) instead of each in its own")


def step_flops(cfg, lora_rank: int, targets: tuple[str, ...], B: int, L: int, head_tokens: int | None = None) -> float:
    """FLOPs of one step (module docstring); `head_tokens`: positions the LM head must score (default all)."""
    D, V = cfg.d_model, cfg.vocab_size
    shapes = roofline.matmul_shapes(cfg)
    body = cfg.n_layers * roofline.layer_params(cfg)
    lora = cfg.n_layers * sum(lora_rank * (a + b) for t, (a, b) in shapes.items() if t in targets)
    head_lora = lora_rank * (D + V) if "lm_head" in targets else 0
    T = B * L
    head_tokens = T if head_tokens is None else head_tokens
    attn_fwd = roofline.attention_flops(cfg, B * L * L)
    return 4.0 * (body * T + D * V * head_tokens) + 3.0 * attn_fwd + 6.0 * (lora * T + head_lora * head_tokens)


def _batch(cfg, B: int, L: int, seed: int = 0) -> dict[str, np.ndarray]:
    r = np.random.default_rng(seed)
    tokens = r.integers(0, cfg.vocab_size, (B, L + 1)).astype(np.int32)
    loss = np.zeros((B, L), bool)
    loss[:, L // 2 :] = True  # an API-span-like loss region: the second half of every row
    return dict(inputs=tokens[:, :-1], targets=tokens[:, 1:], loss_mask=loss, attn_mask=np.ones((B, L), bool),
                positions=np.broadcast_to(np.arange(L, dtype=np.int32), (B, L)).copy())


def ours(cfg, lora_cfg, tcfg, batch, sparse_head: bool = True):
    import jax

    from memllm_jax.config import MeshConfig
    from memllm_jax.sharding import make_mesh
    from memllm_jax.train import step as S
    from memllm_jax.train.data import head_positions, round_capacity
    from memllm_jax.model.placement import create_model
    from memllm_jax.train.optimizer import make_optimizer

    mesh = make_mesh(MeshConfig(1, 1, 1), jax.devices()[:1])
    split = S.split_model(create_model(cfg, lora_cfg, mesh, 0), "lora")
    tx = make_optimizer(tcfg, 1000)
    sh = S.train_state_shardings(split, tx, mesh)
    box = {"state": S.init_train_state(split, tx, sh)}
    step = S.make_train_step(split, tx, mesh, sh)
    local = {k: v[None] for k, v in batch.items()}
    if sparse_head:  # as the training loop's loader does, with one group (one device)
        capacity = round_capacity(int(batch["loss_mask"].sum()), batch["loss_mask"].size)
        local["head_index"], local["head_valid"] = head_positions(local["loss_mask"], 1, capacity)
    gb = S.to_global(local, mesh)

    def run():
        box["state"], m = step(box["state"], split.frozen, gb)
        jax.block_until_ready(m["loss"])

    return run


def hf_peft(cfg, lora_cfg, tcfg, batch, threads: int = 0):
    """HF Mistral + PEFT LoRA, float32 weights; with `cfg.matmul_dtype` "bfloat16" the forward runs under
    `torch.autocast("cpu", torch.bfloat16)` (bf16 matmul operands, as ours)."""
    import contextlib

    import torch

    torch.set_num_threads(threads or os.cpu_count() or 1)
    from peft import LoraConfig as PeftLora, get_peft_model
    from transformers import MistralForCausalLM

    hf_cfg = hf_mistral_config(cfg)
    torch.manual_seed(0)
    model = MistralForCausalLM(hf_cfg)
    names = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
             "down": "down_proj", "lm_head": "lm_head"}
    peft_cfg = PeftLora(r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=lora_cfg.dropout,
                        target_modules=[names[t] for t in lora_cfg.targets], bias="none",
                        trainable_token_indices=list(lora_cfg.trainable_tokens) or None)
    model = get_peft_model(model, peft_cfg)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tcfg.lr, betas=(tcfg.b1, tcfg.b2), eps=tcfg.eps, weight_decay=tcfg.weight_decay)
    inputs = torch.from_numpy(batch["inputs"].astype(np.int64))
    targets = torch.from_numpy(batch["targets"].astype(np.int64))
    mask = torch.from_numpy(batch["loss_mask"])
    positions = torch.from_numpy(batch["positions"].astype(np.int64))

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if cfg.matmul_dtype == "bfloat16"
                else contextlib.nullcontext())

    def run():
        with autocast:
            logits = model(input_ids=inputs, position_ids=positions).logits.float()
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
        loss = (nll * mask.reshape(-1)).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, tcfg.clip_norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run


def main(args: argparse.Namespace) -> int:
    # In one process the malloc setting comes first, before JAX and torch allocate; workers apply their own.
    kept = args.same_process and not args.default_malloc and keep_freed_memory()
    torch_env = OMP_PASSIVE if args.omp_passive else {}
    if args.same_process:
        os.environ.update(torch_env)  # before torch loads OpenMP
    import torch

    from memllm_jax.config import PRESETS, LoraConfig
    from memllm_jax.train.config import TrainConfig

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    cfg = dataclasses.replace(PRESETS[args.preset], max_seq_len=max(args.seq_len, PRESETS[args.preset].max_seq_len))
    if args.matmul_dtype:
        cfg = dataclasses.replace(cfg, matmul_dtype=args.matmul_dtype)
    if cfg.d_model < 512:
        print(f"note: preset {args.preset} has d_model {cfg.d_model} < 512")
    lora_cfg = LoraConfig(rank=args.rank, alpha=8.0, dropout=args.dropout,
                          trainable_tokens=tuple(range(cfg.vocab_size - args.trainable_tokens, cfg.vocab_size)))
    tcfg = TrainConfig(train_data=("-",), tokenizer="-", lr=1e-4, weight_decay=0.0, clip_norm=1.0)
    batch = _batch(cfg, args.batch, args.seq_len)
    jax_setup = None if args.default_malloc else keep_freed_memory
    specs = {"memllm_jax": Spec(ours, (cfg, lora_cfg, tcfg, batch), setup=jax_setup)}
    if args.full_head:
        specs["memllm_jax (full head)"] = Spec(ours, (cfg, lora_cfg, tcfg, batch), {"sparse_head": False},
                                               setup=jax_setup)
    if not args.no_peer:
        specs["hf+peft"] = Spec(hf_peft, (cfg, lora_cfg, tcfg, batch, args.threads), env=torch_env,
                                setup=keep_freed_memory if args.peer_keeps_freed_memory else None)
    # The ceiling first, here, while no contender exists yet (none runs concurrently with it).
    ceil = ceiling.measure(ceiling.model_dtypes(cfg), [int(s) for s in args.matmul_sizes.split(",")])
    if args.same_process:  # the specs' env and setup apply in workers only
        t = interleaved({name: spec.build() for name, spec in specs.items()}, repeats=args.repeats, warmup=1)
    else:
        setup_results: dict[str, object] = {}
        t = interleaved_in_workers(specs, repeats=args.repeats, warmup=1, setup_results=setup_results)
        kept = bool(setup_results["memllm_jax"])

    T = args.batch * args.seq_len
    flops = step_flops(cfg, args.rank, lora_cfg.targets, args.batch, args.seq_len, int(batch["loss_mask"].sum()))
    best = ceil.best
    rows = []
    for name in specs:
        sec = t[name].median
        rows.append([name, f"{sec * 1e3:.1f} ±{t[name].spread:.0%}", f"{T / sec:,.0f}", f"{flops / sec / 1e9:.1f}",
                     f"{flops / sec / best.flops:.0%}"])
    rows.append([f"matmul {best.n}^3 {best.framework} {best.dtype} (ceiling, best of {len(ceil.measurements)})",
                 f"{best.seconds * 1e3:.2f} (best)", "-", f"{best.flops / 1e9:.1f}", "100%"])
    print(f"LoRA train step: preset {args.preset} (d_model {cfg.d_model}, {cfg.n_layers} layers, vocab "
          f"{cfg.vocab_size}), LoRA r={args.rank} on {','.join(lora_cfg.targets)}, dropout {args.dropout}, "
          f"{args.trainable_tokens} trainable embedding rows, "
          f"batch {args.batch} x {args.seq_len} tokens (loss on the second half of each row), {cfg.compute_dtype}"
          f"{f' with {cfg.matmul_dtype} matmul operands' if cfg.matmul_dtype else ''}, "
          f"{flops / 1e9:.1f} GFLOP/step; median of {args.repeats}; "
          + ("all contenders in one process (--same-process)" if args.same_process
             else "each contender in its own process"))
    where = ("for every contender of this process" if args.same_process else
             "in memllm_jax's workers" + ("" if args.no_peer else " and in hf+peft's" if args.peer_keeps_freed_memory
                                          else ", glibc malloc defaults in hf+peft's"))
    print("host memory: " + (f"freed memory kept for reuse (runtime.host_memory.keep_freed_memory, as in `memllm "
                             f"train`; {where})" if kept else "glibc malloc defaults"))
    if not args.no_peer:
        print(f"hf+peft: {args.threads or os.cpu_count()} torch threads, OpenMP wait policy "
              f"{'PASSIVE' if args.omp_passive else 'default'}")
    print(markdown_table(["contender", "ms/step", "tokens/s", "GFLOP/s", "of matmul ceiling"], rows))
    print(f"steps (ms, in the order run): {samples_line(t)}")
    if "hf+peft" in t:
        print(f"memllm_jax vs HF+PEFT tokens/s: {ratio_row(t['memllm_jax'], t['hf+peft'])}  (goal >= 1.5x)")
    if args.full_head:
        print(f"memllm_jax, head at the loss positions vs at every position: "
              f"{ratio_row(t['memllm_jax'], t['memllm_jax (full head)'])}")
    print(f"memllm_jax achieved / matmul ceiling: {flops / t['memllm_jax'].median / best.flops:.0%}  (goal >= 40%)")
    return 0
