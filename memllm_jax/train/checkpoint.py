"""Train-state checkpoints: Orbax `CheckpointManager` with two items, `state` and `data`.

`state` is the `TrainState` (step, trained parameters, optimizer state, dropout RNG counters) flattened to a
`{key path: array}` dict, so the on-disk layout does not depend on pytree node classes; PRNG keys are stored
as their raw key data. In LoRA mode the trained parameters are the adapters only, so checkpoints are small
(the frozen base is referenced by `TrainConfig.init_checkpoint`). `data` is the grain iterator state (JSON).

Restoring takes an abstract `TrainState` whose `ShapeDtypeStruct`s carry the target shardings, so a
checkpoint written under one mesh restores into any other. These are for resuming a run; the trained model a
run produces is a model checkpoint (`memllm_jax.checkpoint`) in `<workdir>/model`.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _flatten(tree) -> dict[str, Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    out = {}
    for path, leaf in leaves:
        out[jax.tree_util.keystr(path)] = jax.random.key_data(leaf) if _is_key(leaf) else leaf
    return out


def _abstract_flat(abstract_tree) -> dict[str, Any]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(abstract_tree)
    out = {}
    for path, leaf in leaves:
        if _is_key(leaf):
            shape = jax.eval_shape(jax.random.key_data, leaf)
            leaf = jax.ShapeDtypeStruct(shape.shape, shape.dtype, sharding=getattr(leaf, "sharding", None))
        out[jax.tree_util.keystr(path)] = leaf
    return out


class Checkpointer:
    """Keep-N, optionally asynchronous train-state checkpoints under `directory`."""

    def __init__(self, directory: str, *, keep: int = 2, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True, enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self.manager.all_steps())

    def clear(self) -> None:
        """Delete every checkpoint (a run that starts over must not leave older, higher steps to be kept or
        resumed in place of its own)."""
        for step in self.all_steps():
            self.manager.delete(step)

    def save(self, step: int, state, data_state: dict | None) -> None:
        args = ocp.args.Composite(
            state=ocp.args.PyTreeSave(_flatten(state)),
            data=ocp.args.JsonSave(data_state or {}),
        )
        self.manager.save(step, args=args, force=True)

    def restore(self, abstract_state, step: int | None = None) -> tuple[Any, dict]:
        """`(state, data_state)` restored into the shardings carried by `abstract_state`."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        target = _abstract_flat(abstract_state)
        restore_args = jax.tree.map(
            lambda a: ocp.ArrayRestoreArgs(sharding=a.sharding, global_shape=a.shape, dtype=a.dtype)
            if getattr(a, "sharding", None) is not None else ocp.RestoreArgs(restore_type=np.ndarray),
            target,
        )
        restored = self.manager.restore(
            step,
            args=ocp.args.Composite(
                state=ocp.args.PyTreeRestore(target, restore_args=restore_args),
                data=ocp.args.JsonRestore(),
            ),
        )
        flat = restored["state"]
        missing = set(target) - set(flat)
        if missing:
            raise ValueError(f"checkpoint {self.directory}/{step} lacks {sorted(missing)[:3]} (different config?)")
        leaves_with_path, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
        values = []
        for path, leaf in leaves_with_path:
            value = flat[jax.tree_util.keystr(path)]
            if _is_key(leaf):
                impl = getattr(leaf.dtype, "_impl", None)
                value = jax.random.wrap_key_data(value, impl=impl) if impl is not None else jax.random.wrap_key_data(value)
            values.append(value)
        return jax.tree_util.tree_unflatten(treedef, values), dict(restored["data"] or {})

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
