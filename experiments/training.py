"""The pipeline's bridge to the training module: build a TrainConfig from an experiment config module plus
the pipeline's paths and overrides, run it, and load the trained models back."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from typing import Callable, Sequence


def train_config(module: str, section: str, overrides: Sequence[str], **paths):
    from memllm_jax.config import override

    cfg = importlib.import_module(f"experiments.configs.{module}").get_config()
    cfg = dataclasses.replace(cfg, train_data=(paths["train_data"],), tokenizer=paths["tokenizer"],
                              workdir=paths["workdir"], init_checkpoint=paths.get("init"))
    mine = [o.split(".", 1)[1] for o in overrides if o.startswith(section + ".")]
    return override(cfg, *mine) if mine else cfg


def _init_path(init: str) -> str:
    """An HF directory or a `.gguf` file is used as it is; a pipeline training workdir gives its final `params/`."""
    p = pathlib.Path(init)
    return str(p) if (p / "config.json").exists() or p.suffix.lower() == ".gguf" else str(p / "params")


def run_training(module: str, section: str, overrides: Sequence[str], *, train_data: str, tokenizer: str,
                 workdir: str, init: str | None, say: Callable[[str], None] = print) -> dict:
    cfg = train_config(module, section, overrides, train_data=train_data, tokenizer=tokenizer, workdir=workdir,
                       init=(_init_path(init) if init else None))
    try:
        from memllm_jax.train.loop import train
    except ImportError as exc:  # the training module has not landed its loop yet
        raise SystemExit(f"training stage {section!r}: memllm_jax.train.loop.train is not available ({exc})") from exc
    say(f"  training {section}: {module} -> {workdir}")
    result = train(cfg)
    return result if isinstance(result, dict) else {"result": str(result)}


def load_trained(workdir: str | pathlib.Path, vocab_size: int | None = None):
    """The model trained in `workdir` (its base merged with the adapter for LoRA runs). For an HF directory (a
    pretrained base), `vocab_size` is the tokenizer's: rows for the added API markers are appended."""
    from memllm_jax.model.gguf import resolve_model_dir

    workdir = resolve_model_dir(workdir)  # a .gguf file: its converted HF directory
    if (workdir / "config.json").exists():
        import json

        from memllm_jax.model.hf import load_hf

        hf_vocab = int(json.loads((workdir / "config.json").read_text())["vocab_size"])
        return load_hf(workdir, extra_tokens=max(0, (vocab_size or hf_vocab) - hf_vocab))[1]
    from memllm_jax.train.loop import load_trained_model

    return load_trained_model(str(workdir))
