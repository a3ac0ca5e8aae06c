"""`memllm bench model`: forward-pass tokens/s and achieved FLOP/s of our decoder for the TINY and SMALL
configs, next to HF transformers (torch) on the same config, weights and batch (measured interleaved in the
same run), and the machine's dense matmul ceiling (`bench.ceiling`: best of sizes, jax and torch, the dtypes
the model computes in)."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import tempfile

from memllm_jax.bench.roofline import forward_flops
from memllm_jax.config import ModelConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", default="tiny,small", help="comma-separated presets")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--hf-attn", default="sdpa", choices=["sdpa", "eager"], help="HF attention implementation")
    parser.add_argument("--matmul-sizes", default="512,1024,2048", help="sides of the square matmuls for the ceiling")


def hf_mistral_config(cfg: ModelConfig):
    """The HF `MistralConfig` (eager attention) with the shapes of `cfg`."""
    from transformers import MistralConfig

    return MistralConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.d_model,
        intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_theta,
        sliding_window=cfg.sliding_window,
        tie_word_embeddings=cfg.tie_embeddings,
        attn_implementation="eager",
    )


def hf_mistral(cfg: ModelConfig, seed: int = 0, dtype: str = "float32"):
    """A random `MistralForCausalLM` (eager attention) with the shapes of `cfg`, in eval mode."""
    import torch
    from transformers import MistralForCausalLM

    torch.manual_seed(seed)
    hf_cfg = hf_mistral_config(cfg)
    model = MistralForCausalLM(hf_cfg).to(getattr(torch, dtype)).eval()
    # HF initialises norms to ones; randomise them so the parity test also checks the norm mapping.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def main(args: argparse.Namespace) -> int:
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch
    from flax import nnx

    from memllm_jax.bench import ceiling as C
    from memllm_jax.bench.timing import interleaved, markdown_table, ratio_row
    from memllm_jax.config import PRESETS
    from memllm_jax.model.load import load

    torch.set_grad_enabled(False)
    configs = {name: dataclasses.replace(PRESETS[name], sliding_window=None, max_seq_len=max(args.length, 8))
               for name in args.configs.split(",")}
    dtypes = sorted({d for cfg in configs.values() for d in C.model_dtypes(cfg)})
    ceil = C.measure(dtypes, [int(s) for s in args.matmul_sizes.split(",")])
    ceiling = ceil.flops

    rows = []
    date = datetime.date.today().isoformat()
    print(f"memllm bench model  ({date}; jax {jax.__version__} on {jax.devices()[0].platform}, torch {torch.__version__}"
          f" threads {torch.get_num_threads()}; batch {args.batch} x length {args.length}, {'/'.join(dtypes)}; "
          f"{ceil.describe()})")
    for name, cfg in configs.items():
        hf = hf_mistral(cfg, seed=0)
        hf.config._attn_implementation = args.hf_attn
        with tempfile.TemporaryDirectory() as tmp:
            hf.save_pretrained(tmp)
            model, _ = load(tmp, say=None)
        graphdef, state = nnx.split(model)
        forward = jax.jit(lambda s, t, p: nnx.merge(graphdef, s)(t, p)[0])
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, cfg.vocab_size, (args.batch, args.length)).astype(np.int32)
        positions = np.broadcast_to(np.arange(args.length, dtype=np.int32), tokens.shape)
        tokens_j, positions_j = jnp.asarray(tokens), jnp.asarray(positions)
        tokens_t = torch.as_tensor(tokens, dtype=torch.long)
        positions_t = torch.as_tensor(positions.copy(), dtype=torch.long)

        def ours():
            forward(state, tokens_j, positions_j).block_until_ready()

        def peer():
            hf(input_ids=tokens_t, position_ids=positions_t)

        ours_logits = np.asarray(forward(state, tokens_j, positions_j))
        peer_logits = hf(input_ids=tokens_t, position_ids=positions_t).logits.numpy()
        max_diff = float(np.abs(ours_logits - peer_logits).max())
        t = interleaved({"ours": ours, f"hf-{args.hf_attn}": peer}, repeats=args.repeats)
        flops = forward_flops(cfg, args.batch, args.length)
        ntok = args.batch * args.length
        ours_t, peer_t = t["ours"], t[f"hf-{args.hf_attn}"]
        print(f"{name}: ours vs HF: {ratio_row(ours_t, peer_t)}; max|dlogits| {max_diff:.1e}")
        rows.append([
            name, cfg.d_model,
            f"{ntok / ours_t.median:,.0f} ±{ours_t.spread:.0%}",
            f"{ntok / peer_t.median:,.0f} ±{peer_t.spread:.0%}",
            f"{peer_t.median / ours_t.median:.2f}x",
            f"{flops / ours_t.median / 1e9:.1f}",
            f"{flops / peer_t.median / 1e9:.1f}",
            f"{ceiling / 1e9:.1f}",
            f"{flops / ours_t.median / ceiling:.0%}",
        ])
    print()
    print(markdown_table(
        ["config", "d_model", "ours tok/s", f"HF torch ({args.hf_attn}) tok/s", "ours / HF", "ours GFLOP/s",
         "HF GFLOP/s", "matmul ceiling GFLOP/s", "ours / ceiling"],
        rows,
    ))
    return 0
