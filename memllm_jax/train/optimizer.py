"""AdamW with warmup + decay and global-norm clipping, built from `TrainConfig` with optax."""

from __future__ import annotations

import jax
import optax

from memllm_jax.train.config import TrainConfig


def schedule(cfg: TrainConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup to `lr`, then cosine / linear decay to `lr * end_lr_fraction` (or constant)."""
    warmup = max(0, min(cfg.warmup_steps, total_steps))
    decay_steps = max(1, total_steps - warmup)
    end = cfg.lr * cfg.end_lr_fraction
    if cfg.schedule == "cosine":
        decay = optax.cosine_decay_schedule(cfg.lr, decay_steps, alpha=cfg.end_lr_fraction)
    elif cfg.schedule == "linear":
        decay = optax.linear_schedule(cfg.lr, end, decay_steps)
    else:
        decay = optax.constant_schedule(cfg.lr)
    if warmup == 0:
        return decay
    return optax.join_schedules([optax.linear_schedule(0.0, cfg.lr, warmup), decay], [warmup])


def _decay_mask(params):
    """Weight decay on matrices only (norm scales and other vectors are not decayed)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def _module_path(path) -> tuple[str, ...]:
    """A leaf's path as names, without the `nnx.Variable`'s own `.value` step."""
    names = tuple(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
    return names[:-1] if names[-1:] == ("value",) else names


def lora_b_mask(params):
    """True at the adapters' B matrices (`model.lora.LoRA.b`: the variable `b` of a `lora` submodule)."""
    return jax.tree_util.tree_map_with_path(lambda path, _: _module_path(path)[-2:] == ("lora", "b"), params)


def make_optimizer(cfg: TrainConfig, total_steps: int) -> optax.GradientTransformation:
    """`clip_by_global_norm -> adamw(schedule)`, then the B matrices' updates scaled by `cfg.lora_b_lr_ratio`
    (LoRA+: AdamW's update, decay included, is proportional to the learning rate, so this is AdamW with
    `lr * ratio` for them); applied to the trainable parameters only."""
    parts = []
    if cfg.clip_norm is not None:
        parts.append(optax.clip_by_global_norm(cfg.clip_norm))
    parts.append(
        optax.adamw(schedule(cfg, total_steps), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                    mask=_decay_mask)
    )
    if cfg.lora_b_lr_ratio != 1.0:
        parts.append(optax.masked(optax.scale(cfg.lora_b_lr_ratio), lora_b_mask))
    return optax.chain(*parts)
