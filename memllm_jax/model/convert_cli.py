"""`memllm convert`: move weights between an HF Mistral directory and a model checkpoint (both directions),
export a model's LoRA adapter in PEFT format, or turn a llama.cpp GGUF file into either (`gguf-to-hf`,
`gguf-to-orbax`; an HF source directory may also be given as `FILE.gguf`).

`orbax-to-*` read any model path (`memllm_jax.model.load`): a model checkpoint, a training workdir, an HF
directory. `*-to-orbax` write a model checkpoint with the tokenizer beside it (the API
markers added, and by default as many vocabulary rows appended as the markers need)."""

from __future__ import annotations

import argparse
import os


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("direction", choices=["hf-to-orbax", "orbax-to-hf", "orbax-to-peft", "gguf-to-hf",
                                              "gguf-to-orbax"])
    parser.add_argument("src", help="source: HF directory or FILE.gguf (hf-to-orbax, gguf-to-*), or a model "
                                    "checkpoint / training workdir (orbax-to-*)")
    parser.add_argument("dst", help="destination directory")
    parser.add_argument("--step", type=int, default=None, help="checkpoint step to read (default latest) / write (default 0)")
    parser.add_argument("--merge-lora", action="store_true", help="orbax-to-hf: fold the LoRA adapter into the weights")
    parser.add_argument("--base", default=None,
                        help="HF directory (or FILE.gguf) holding the base weights when the checkpoint is LoRA-only")
    parser.add_argument("--extra-tokens", type=int, default=None,
                        help="hf/gguf-to-orbax: append N vocabulary rows (mean init); default: the rows the "
                             "tokenizer's added API markers need (0 without a tokenizer)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default=None,
                        help="hf/gguf-to-orbax: parameter dtype")


def main(args: argparse.Namespace) -> int:
    from memllm_jax.errors import InputError
    from memllm_jax.model.gguf import gguf_to_hf, is_gguf

    if args.direction.startswith("gguf-to-") and not is_gguf(args.src):
        raise InputError(f"{args.src}: {args.direction} reads a .gguf file")
    if args.direction == "gguf-to-hf":
        out = gguf_to_hf(args.src, args.dst)
        print(f"wrote {out} (HF Llama directory with its tokenizer) from {args.src}")
        return 0
    if args.direction in ("hf-to-orbax", "gguf-to-orbax"):
        return _to_checkpoint(args)
    from memllm_jax.model.load import identify, load

    model, tokenizer = load(args.src, merge_lora=False, step=args.step, base=args.base)
    base = args.base or (_base_source(identify(args.src)) if args.direction == "orbax-to-peft" else None)
    if args.direction == "orbax-to-hf":
        from memllm_jax.model.hf import save_hf

        save_hf(model, args.dst, merge_lora=args.merge_lora)
        if model.lora_cfg is not None and not args.merge_lora:
            import sys

            print(f"note: {args.src} has a LoRA adapter, not in this export (pass --merge-lora to fold it in, or "
                  f"use orbax-to-peft)", file=sys.stderr)
        if tokenizer is not None:
            tokenizer.save(args.dst)
    else:
        from memllm_jax.model.hf import save_peft_adapter

        save_peft_adapter(model, args.dst, base_model_name_or_path=base)
    print(f"wrote {args.dst} from {args.src}" + (" with its tokenizer" if tokenizer is not None and
                                                 args.direction == "orbax-to-hf" else ""))
    return 0


def _to_checkpoint(args: argparse.Namespace) -> int:
    """hf/gguf-to-orbax: a model checkpoint with the HF directory's tokenizer (markers added) beside it."""
    from memllm_jax.checkpoint import save_params
    from memllm_jax.errors import InputError
    from memllm_jax.model.gguf import is_gguf
    from memllm_jax.model.load import CHECKPOINT, WORKDIR, identify, load

    if not is_gguf(args.src) and not os.path.exists(os.path.join(args.src, "config.json")):
        raise FileNotFoundError(f"{os.path.join(args.src, 'config.json')} does not exist")
    src = identify(args.src)
    if src.kind in (CHECKPOINT, WORKDIR):
        raise InputError(f"{args.src}: {args.direction} reads an HF directory or a .gguf file, not a {src.kind}")
    model, tok = load(args.src, extra_tokens=args.extra_tokens, dtype=args.dtype)
    cfg = model.cfg
    step = 0 if args.step is None else args.step
    save_params(args.dst, step, model, tokenizer=tok)
    print(f"wrote {args.dst} step {step}: {cfg.n_layers} layers, d_model {cfg.d_model}, vocab {cfg.vocab_size}"
          + (f", tokenizer ({tok.vocab_size} ids with the API markers) in {args.dst}/tokenizer" if tok is not None
             else " (no tokenizer in the source)"))
    return 0


def _base_source(src) -> str | None:
    """For a PEFT export: the HF directory / .gguf the adapter was trained on, when the checkpoint says."""
    from memllm_jax.checkpoint import read_stored
    from memllm_jax.model.load import CHECKPOINT, WORKDIR

    if src.kind not in (CHECKPOINT, WORKDIR):
        return None
    base = read_stored(src.weights).base
    return None if base is None else base["source"]
