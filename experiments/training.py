"""The pipeline's bridge to the training module: build a TrainConfig from an experiment config module plus
the pipeline's paths and overrides, and run it (`memllm_jax.model.load` opens the trained models)."""

from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Sequence


def train_config(module: str, section: str, overrides: Sequence[str], **paths):
    from memllm_jax.config import override

    cfg = importlib.import_module(f"experiments.configs.{module}").get_config()
    cfg = dataclasses.replace(cfg, train_data=(paths["train_data"],), tokenizer=paths["tokenizer"],
                              workdir=paths["workdir"], init_checkpoint=paths.get("init"))
    mine = [o.split(".", 1)[1] for o in overrides if o.startswith(section + ".")]
    return override(cfg, *mine) if mine else cfg


def run_training(module: str, section: str, overrides: Sequence[str], *, train_data: str, tokenizer: str,
                 workdir: str, init: str | None, say: Callable[[str], None] = print) -> dict:
    cfg = train_config(module, section, overrides, train_data=train_data, tokenizer=tokenizer, workdir=workdir,
                       init=init)  # any model path: HF dir, .gguf, a workdir
    try:
        from memllm_jax.train.loop import train
    except ImportError as exc:  # the training module has not landed its loop yet
        raise SystemExit(f"training stage {section!r}: memllm_jax.train.loop.train is not available ({exc})") from exc
    say(f"  training {section}: {module} -> {workdir}")
    result = train(cfg)
    return result if isinstance(result, dict) else {"result": str(result)}
