"""The jitted train and eval steps over a functional split of the model.

The model is split once into `graphdef` (static), `params` (trained: every `nnx.Param` in full mode, the
`nnx.LoRAParam` leaves in LoRA mode), `rngs` (dropout stream counters) and `frozen` (everything else, e.g.
the base weights under LoRA). Only `params` gets gradients and optimizer state.

A batch is `[micro_batches, rows, L]`; the step scans over the micro-batches, summing gradients of
`loss_sum / n_loss_tokens(global batch)`, so accumulation equals one large batch.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx, struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from memllm_jax.sharding import state_shardings
from memllm_jax.train.loss import masked_cross_entropy

BATCH_FIELDS = ("inputs", "targets", "loss_mask", "attn_mask", "positions", "segment_ids")
"""`segment_ids` numbers the examples packed in a row (attention stays within one); a batch without it is one
example per row."""
PREFIX_FIELDS = ("prefix_segment_ids", "prefix_lengths")
"""Optional ("pack_prefixes" packing, `train.data`): per token, an earlier segment of its row and how many of that
segment's first tokens it also attends to (the prefix it shares with it)."""
HEAD_FIELDS = ("head_index", "head_valid")
"""Optional (`train.data.head_positions`): the loss positions of each group of rows, `[groups, K]` per micro-batch,
one group per batch shard. With them the LM head runs at those K positions only, not at all `rows x L`: the API
spans are a third of the tokens, and the head (d_model x vocab) and its softmax are the largest per-token cost
of a small model with a large vocabulary."""


@struct.dataclass
class TrainState:
    step: jax.Array
    params: Any
    opt_state: Any
    rngs: Any


@dataclasses.dataclass
class Split:
    graphdef: Any
    params: nnx.State
    rngs: nnx.State
    frozen: nnx.State


def trainable_filter(mode: str):
    return nnx.LoRAParam if mode == "lora" else nnx.Param


def split_model(model: nnx.Module, mode: str) -> Split:
    graphdef, params, rngs, frozen = nnx.split(model, trainable_filter(mode), nnx.RngState, ...)
    return Split(graphdef, params, rngs, frozen)


def merge(split: Split, params=None, rngs=None, frozen=None) -> nnx.Module:
    return nnx.merge(split.graphdef, split.params if params is None else params,
                     split.rngs if rngs is None else rngs, split.frozen if frozen is None else frozen)


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, micro: bool = True) -> NamedSharding:
    """Every batch field: `[micro, rows, L]` with rows over ("data", "fsdp") (or `[rows, L]` when `micro` is
    False); the head fields `[micro, groups, K]` likewise, one group per batch shard."""
    spec = PartitionSpec(None, ("data", "fsdp"), None) if micro else PartitionSpec(("data", "fsdp"), None)
    return NamedSharding(mesh, spec)


def batch_loss(model, batch: dict, deterministic: bool) -> tuple[jax.Array, jax.Array]:
    """`(sum of -log p(target), n)` over the batch's loss positions (`masked_cross_entropy`); with the head fields,
    the LM head scores the gathered loss positions only (the same sum: the other positions weigh zero)."""
    args = (batch["inputs"], batch["positions"], batch["attn_mask"])
    kwargs = dict(deterministic=deterministic, segment_ids_BxL=batch["segment_ids"])
    if "prefix_segment_ids" in batch:
        kwargs.update(prefix_segment_ids_BxL=batch["prefix_segment_ids"], prefix_lengths_BxL=batch["prefix_lengths"])
    if "head_index" not in batch:
        logits, _ = model(*args, **kwargs)
        return masked_cross_entropy(logits, batch["targets"], batch["loss_mask"])
    hidden_BxLxD, _ = model(*args, **kwargs, return_hidden=True)
    index_GxK = batch["head_index"]
    B, L, D = hidden_BxLxD.shape
    G = index_GxK.shape[0]
    hidden_GxKxD = jnp.take_along_axis(hidden_BxLxD.reshape(G, B // G * L, D), index_GxK[..., None], axis=1)
    targets_GxK = jnp.take_along_axis(batch["targets"].reshape(G, B // G * L), index_GxK, axis=1)
    return masked_cross_entropy(model.head(hidden_GxKxD, deterministic), targets_GxK, batch["head_valid"])


def _var_shardings(tree, mesh: Mesh):
    """Shardings of an nnx.State from its logical axes (same tree structure, NamedSharding leaves)."""
    return state_shardings(tree, mesh)


def train_state_shardings(split: Split, tx: optax.GradientTransformation, mesh: Mesh) -> TrainState:
    """Shardings of the TrainState: parameters by logical axes; optimizer moments like their parameters."""
    param_sh = _var_shardings(split.params, mesh)
    abstract_opt = jax.eval_shape(tx.init, split.params)
    opt_sh = optax.tree_map_params(
        tx, lambda _, s: s, abstract_opt, param_sh, transform_non_params=lambda _: replicated(mesh),
        is_leaf=lambda x: isinstance(x, NamedSharding),
    )
    rng_sh = jax.tree.map(lambda _: replicated(mesh), split.rngs)
    return TrainState(step=replicated(mesh), params=param_sh, opt_state=opt_sh, rngs=rng_sh)


def init_train_state(split: Split, tx: optax.GradientTransformation, shardings: TrainState) -> TrainState:
    def init(params, rngs):
        return TrainState(jnp.zeros((), jnp.int32), params, tx.init(params), rngs)

    return jax.jit(init, out_shardings=shardings)(split.params, split.rngs)


def make_train_step(split: Split, tx: optax.GradientTransformation, mesh: Mesh, shardings: TrainState,
                    lr_schedule: Callable | None = None, return_grads: bool = False):
    """`step(state, frozen, batch) -> (state, metrics)`, jitted with shardings; `state` is donated.

    `return_grads` adds the accumulated gradients to the metrics (for tests).
    """
    graphdef = split.graphdef

    def step_fn(state: TrainState, frozen, batch):
        n_global = batch["loss_mask"].astype(jnp.float32).sum()
        denom = jnp.maximum(n_global, 1.0)

        def micro(carry, mb):
            grads_acc, rngs, loss_acc = carry

            def loss_fn(params, rngs):  # rngs passed in so their counters are updated at this trace level
                model = nnx.merge(graphdef, params, rngs, frozen, copy=True)
                total, _ = batch_loss(model, mb, deterministic=False)
                return total / denom, (total, nnx.state(model, nnx.RngState))

            (_, (total, new_rngs)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, rngs)
            grads_acc = jax.tree.map(jnp.add, grads_acc, grads)
            return (grads_acc, new_rngs, loss_acc + total), None

        zeros = jax.tree.map(jnp.zeros_like, state.params)
        (grads, rngs, loss_sum), _ = jax.lax.scan(micro, (zeros, state.rngs, jnp.zeros((), jnp.float32)), batch)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        metrics = {
            "loss": loss_sum / denom,
            "loss_tokens": n_global,
            "grad_norm": optax.global_norm(grads),
        }
        if lr_schedule is not None:
            metrics["lr"] = lr_schedule(state.step)
        if return_grads:
            metrics["grads"] = grads
        return TrainState(state.step + 1, params, opt_state, rngs), metrics

    frozen_sh = _var_shardings(split.frozen, mesh)
    jitted = jax.jit(
        step_fn,
        in_shardings=(shardings, frozen_sh, batch_sharding(mesh)),
        out_shardings=(shardings, replicated(mesh)),
        donate_argnums=(0,),
    )

    def step(state, frozen, batch):
        with jax.set_mesh(mesh):
            return jitted(state, frozen, batch)

    step.jitted = jitted
    return step


def make_eval_step(split: Split, mesh: Mesh, shardings: TrainState):
    """`eval(params, rngs, frozen, batch[rows, L]) -> (loss_sum, n_tokens)` (deterministic)."""
    graphdef = split.graphdef

    def eval_fn(params, rngs, frozen, batch):
        model = nnx.merge(graphdef, params, rngs, frozen, copy=True)
        return batch_loss(model, batch, deterministic=True)

    frozen_sh = _var_shardings(split.frozen, mesh)
    jitted = jax.jit(
        eval_fn,
        in_shardings=(shardings.params, shardings.rngs, frozen_sh, batch_sharding(mesh, micro=False)),
        out_shardings=replicated(mesh),
    )

    def run(params, rngs, frozen, batch):
        with jax.set_mesh(mesh):
            return jitted(params, rngs, frozen, batch)

    return run


def to_global(local: dict, mesh: Mesh, micro: bool = True) -> dict[str, jax.Array]:
    """Assemble this process's slice of a batch into global arrays sharded over the batch axes."""
    sh = batch_sharding(mesh, micro)
    out = {}
    local = dict(local)
    local.setdefault("segment_ids", np.asarray(local["attn_mask"]).astype(np.int32))  # one example per row
    for k in BATCH_FIELDS + tuple(f for f in PREFIX_FIELDS + HEAD_FIELDS if f in local):
        x = local[k]
        axis = 1 if micro else 0
        shape = list(x.shape)
        shape[axis] *= jax.process_count()
        out[k] = jax.make_array_from_process_local_data(sh, x, tuple(shape))
    return out
