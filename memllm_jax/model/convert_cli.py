"""`memllm convert`: move weights between an HF Mistral directory and an Orbax checkpoint (both directions),
export a checkpoint's LoRA adapter in PEFT format, or turn a llama.cpp GGUF file into either (`gguf-to-hf`,
`gguf-to-orbax`; an HF source directory may also be given as `FILE.gguf`)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("direction", choices=["hf-to-orbax", "orbax-to-hf", "orbax-to-peft", "gguf-to-hf",
                                              "gguf-to-orbax"])
    parser.add_argument("src", help="source: HF directory or FILE.gguf (hf-to-orbax, gguf-to-*), "
                                    "or Orbax checkpoint directory")
    parser.add_argument("dst", help="destination directory")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step to read (default latest) / write (default 0)")
    parser.add_argument("--merge-lora", action="store_true", help="orbax-to-hf: fold the LoRA adapter into the weights")
    parser.add_argument("--base", default=None,
                        help="HF directory (or FILE.gguf) holding the base weights when the checkpoint is LoRA-only")
    parser.add_argument("--extra-tokens", type=int, default=0,
                        help="hf/gguf-to-orbax: append N vocabulary rows (mean init)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="hf/gguf-to-orbax: parameter dtype")


def main(args: argparse.Namespace) -> int:
    from memllm_jax.checkpoint import read_configs, restore_params, save_params
    from memllm_jax.model.gguf import gguf_to_hf, is_gguf, resolve_model_dir
    from memllm_jax.model.hf import load_hf, save_hf, save_peft_adapter
    from memllm_jax.sharding import abstract_model

    if args.direction.startswith("gguf-to-") and not is_gguf(args.src):
        from memllm_jax.errors import InputError

        raise InputError(f"{args.src}: {args.direction} reads a .gguf file")
    if args.direction == "gguf-to-hf":
        out = gguf_to_hf(args.src, args.dst)
        print(f"wrote {out} (HF Llama directory with its tokenizer) from {args.src}")
        return 0
    if args.direction in ("hf-to-orbax", "gguf-to-orbax"):
        src = resolve_model_dir(args.src)
        overrides = {"param_dtype": args.dtype} if args.dtype else {}
        cfg, model = load_hf(src, extra_tokens=args.extra_tokens, **overrides)
        step = 0 if args.step is None else args.step
        save_params(args.dst, step, model)
        print(f"wrote {args.dst} step {step}: {cfg.n_layers} layers, d_model {cfg.d_model}, vocab {cfg.vocab_size}")
        if is_gguf(args.src):
            print(f"the tokenizer (and HF weights) of {args.src} are in {src}")
        return 0
    cfg, lora, step = read_configs(args.src, args.step)
    if args.base:
        _, target = load_hf(resolve_model_dir(args.base), lora=lora, param_dtype=cfg.param_dtype)
        if target.cfg.vocab_size != cfg.vocab_size:
            raise SystemExit(f"--base {args.base}: vocab {target.cfg.vocab_size} != checkpoint vocab {cfg.vocab_size}")
    else:
        target = abstract_model(cfg, lora, None)
    model = restore_params(args.src, target, step)
    if args.direction == "orbax-to-hf":
        save_hf(model, args.dst, merge_lora=args.merge_lora)
    else:
        save_peft_adapter(model, args.dst, base_model_name_or_path=args.base)
    print(f"wrote {args.dst} from {args.src} step {step}")
    return 0
