"""The model checkpoint: the one on-disk format of a model that every command opens (see `memllm_jax.model.load`).

Layout (one Orbax `CheckpointManager` directory): `<dir>/<step>/{base,lora,config}` and the tokenizer beside
the steps in `<dir>/tokenizer/`. `config` holds the ModelConfig, the LoraConfig and, for an adapter-only
checkpoint (LoRA finetuning of a pretrained base), a reference to the base: `{"source": path, "extra_tokens": n}`
where `source` is any model path `model.load.load` accepts (HF directory, .gguf, checkpoint, training
workdir) and `n` rows (the API markers) were appended to its vocabulary, mean-initialised, as training did.
`memllm train` writes `<workdir>/model/` in this format, `memllm convert hf-to-orbax` too. Restoring reads into
`jax.ShapeDtypeStruct`s that carry the target shardings, so a checkpoint written under one mesh restores
directly into another, and one written with the other layer layout (`ModelConfig.scan_layers`: keys
`layers.<i>.attn...` unrolled, `layers.attn...` stacked) is stacked or sliced into the target's on restore.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from typing import Any

import jax
from flax import nnx

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.files import naming

BASE, LORA, CONFIG = "base", "lora", "config"


def _manager(directory, read_only: bool = False):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(create=not read_only, enable_async_checkpointing=False)
    handlers = {BASE: ocp.StandardCheckpointHandler(), LORA: ocp.StandardCheckpointHandler(),
                CONFIG: ocp.JsonCheckpointHandler()}
    return ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options, item_handlers=handlers)


def _flat(state) -> dict[str, Any]:
    return {".".join(str(k) for k in path): var.get_value() for path, var in nnx.to_flat_state(state)}


def _split(model):
    from memllm_jax.model.lora import BASE_PARAMS

    return nnx.state(model, BASE_PARAMS), nnx.state(model, nnx.LoRAParam)


TOKENIZER = "tokenizer"


def save_params(directory: str | os.PathLike, step: int, model, *, lora_only: bool = False,
                base: dict | None = None, tokenizer=None) -> None:
    """Save the base parameters (unless `lora_only` or `base`) and the LoRA parameters (if any) at `step`.

    `base`: `{"source": path, "extra_tokens": n}`, where the base weights come from (an adapter-only save);
    `tokenizer`: a tokenizer, or its path (directory, tokenizer.json or .gguf), saved to `<directory>/tokenizer`.
    """
    import orbax.checkpoint as ocp

    base_flat, lora = _split(model)
    lora_flat = _flat(lora)
    lora_only = lora_only or base is not None
    if lora_only and not lora_flat:
        raise ValueError("save_params(lora_only=True): the model has no LoRA parameters")
    items: dict[str, Any] = {
        CONFIG: ocp.args.JsonSave({
            "model": dataclasses.asdict(model.cfg),
            "lora": None if model.lora_cfg is None else dataclasses.asdict(model.lora_cfg),
            "base": base,
        })
    }
    if not lora_only:
        items[BASE] = ocp.args.StandardSave(_flat(base_flat))
    if lora_flat:
        items[LORA] = ocp.args.StandardSave(lora_flat)
    manager = _manager(directory)
    if step in manager.all_steps():  # a finished run exported again (its stage rerun): replace that step
        manager.delete(step)
    manager.save(step, args=ocp.args.Composite(**items), force=True)
    manager.wait_until_finished()
    manager.close()
    if tokenizer is not None and jax.process_index() == 0:
        save_tokenizer(tokenizer, directory)


def save_tokenizer(tokenizer, directory: str | os.PathLike) -> pathlib.Path:
    """Save `tokenizer` (a loaded one, or its path; API markers registered) to `<directory>/tokenizer`,
    atomically."""
    import shutil

    from memllm_jax.tokenizer import load_tokenizer

    out = pathlib.Path(directory) / TOKENIZER
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        (load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer).save(tmp)
    except OSError as exc:  # name the tokenizer folder asked for, not its temp name
        shutil.rmtree(tmp, ignore_errors=True)
        raise naming(exc, out) from exc
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def is_checkpoint(directory: str | os.PathLike) -> bool:
    """A directory in this format: a numbered step directory holding a `config` item."""
    p = pathlib.Path(directory)
    return p.is_dir() and any(c.name.isdigit() and (c / CONFIG).exists() for c in p.iterdir())


@dataclasses.dataclass(frozen=True)
class Stored:
    """What `config` of a checkpoint step says: configs, step, where the base comes from, which items exist."""

    model: ModelConfig
    lora: LoraConfig | None
    step: int
    base: dict | None
    """`{"source", "extra_tokens"}` of an adapter-only checkpoint; None when the base weights are stored."""
    tokenizer: pathlib.Path | None
    """`<dir>/tokenizer` when present."""


def read_stored(directory: str | os.PathLike, step: int | None = None) -> Stored:
    """The `config` item of a checkpoint step (default: the latest step)."""
    import orbax.checkpoint as ocp

    manager = _manager(directory, read_only=True)
    step = _resolve_step(manager, directory, step)
    stored = manager.restore(step, args=ocp.args.Composite(**{CONFIG: ocp.args.JsonRestore()}))[CONFIG]
    manager.close()
    lora = stored.get("lora")
    model = dict(stored["model"])
    model.setdefault("scan_layers", False)  # written before the field existed: unrolled
    lora_cfg = None if lora is None else LoraConfig(**{**lora, "targets": tuple(lora["targets"]),
                                                       "trainable_tokens": tuple(lora.get("trainable_tokens", ()))})
    tok = pathlib.Path(directory) / TOKENIZER
    return Stored(ModelConfig(**model), lora_cfg, step, stored.get("base"), tok if tok.is_dir() else None)


def stored_steps(directory: str | os.PathLike) -> list[int]:
    """The steps a checkpoint directory holds, ascending (e.g. a training run's exports and its final step)."""
    manager = _manager(directory, read_only=True)
    steps = sorted(manager.all_steps())
    manager.close()
    return steps


def _resolve_step(manager, directory, step):
    steps = manager.all_steps()
    if not steps:
        raise FileNotFoundError(f"{directory}: no Orbax checkpoint steps found")
    if step is None:
        return max(steps)
    if step not in steps:
        raise FileNotFoundError(f"{directory}: no checkpoint for step {step} (have {sorted(steps)})")
    return step


def _abstract(state) -> dict[str, jax.ShapeDtypeStruct]:
    out = {}
    for key, value in _flat(state).items():
        out[key] = jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=getattr(value, "sharding", None))
    return out


def _check(directory, step, item, metadata, target) -> None:
    where = f"{directory} (step {step}, item {item!r})"
    missing = sorted(set(target) - set(metadata))
    if missing:
        raise ValueError(f"{where}: parameter {missing[0]!r} is missing ({len(missing)} missing in all)")
    for key, abstract in target.items():
        shape = tuple(metadata[key].shape)
        if shape != tuple(abstract.shape):
            raise ValueError(
                f"{where}: parameter {key!r} has shape {shape}, the target model expects {tuple(abstract.shape)}"
            )


def _relayout(target: dict[str, jax.ShapeDtypeStruct], stored: set[str], n_layers: int):
    """`(read, assemble)`: what to read from a checkpoint whose keys are `stored` so that `assemble(restored)`
    gives every key of `target`, stacking per-layer keys into a scanned target's arrays or slicing a stacked
    one into an unrolled target's (each placed in the target's sharding)."""
    import jax.numpy as jnp

    from memllm_jax.sharding import row_sharding

    read: dict[str, jax.ShapeDtypeStruct] = {}
    build = {}
    for key, a in target.items():
        head, _, rest = key.partition(".")
        index, _, tail = rest.partition(".")
        rows = [f"layers.{i}.{rest}" for i in range(n_layers)]
        if key in stored or head != "layers":
            read[key] = a
        elif rows[0] in stored:  # scanned target, unrolled checkpoint
            for row in rows:
                read[row] = jax.ShapeDtypeStruct(a.shape[1:], a.dtype, sharding=row_sharding(a.sharding))
            build[key] = (lambda rows, a: lambda got: jax.jit(lambda *xs: jnp.stack(xs), out_shardings=a.sharding)(
                *[got[r] for r in rows]))(rows, a)
        elif index.isdigit() and f"layers.{tail}" in stored:  # unrolled target, scanned checkpoint
            stack = f"layers.{tail}"
            read[stack] = jax.ShapeDtypeStruct((n_layers, *a.shape), a.dtype, sharding=row_sharding(a.sharding, -1))
            build[key] = (lambda stack, i, a: lambda got: jax.jit(lambda x: x[i], out_shardings=a.sharding)(
                got[stack]))(stack, int(index), a)
        else:
            read[key] = a  # missing: reported by _check

    def assemble(got: dict) -> dict:
        return {key: build[key](got) if key in build else got[key] for key in target}

    return read, assemble


def restore_params(directory: str | os.PathLike, target, step: int | None = None):
    """Restore into `target` and return the model.

    `target` is a `Decoder` (restored in place; a LoRA-only checkpoint keeps its base weights) or a
    `(graphdef, state)` pair from `model.placement.abstract_model(cfg, lora, mesh)` whose ShapeDtypeStructs carry
    the shardings to restore into (a LoRA-only checkpoint: its base leaves already hold the base's arrays, e.g.
    `hf.load_hf_weights(..., init_rest=False)`); leaves the checkpoint lacks are initialised fresh.
    """
    import orbax.checkpoint as ocp

    if isinstance(target, tuple):
        graphdef, state = target
        model = None
    else:
        model = target
        graphdef, state = nnx.split(model)
    manager = _manager(directory, read_only=True)
    step = _resolve_step(manager, directory, step)
    metadata = manager.item_metadata(step)
    stored_items = {name for name in (BASE, LORA) if metadata.get(name) is not None}
    if model is None:
        base_state = state.filter(nnx.All(nnx.Param, nnx.Not(nnx.LoRAParam)))
        lora_state = state.filter(nnx.LoRAParam)
    else:
        base_state, lora_state = _split(model)
    wanted: dict[str, dict] = {}
    if BASE in stored_items:
        wanted[BASE] = _abstract(base_state)
    elif model is None and any(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(base_state)):
        raise ValueError(f"{directory} (step {step}): has no base parameters; restore it into a concrete model")
    lora_target = _abstract(lora_state)
    if lora_target and LORA in stored_items:  # a target without LoRA takes only the base
        wanted[LORA] = lora_target
    n_layers = nnx.merge(graphdef, state).cfg.n_layers if model is None else model.cfg.n_layers
    plans = {item: _relayout(flat, set(metadata[item]), n_layers) for item, flat in wanted.items()}
    for item, (read, _) in plans.items():
        _check(directory, step, item, metadata[item], read)
    # targets without a sharding (no mesh) take the stored one; when that names devices absent here (written by
    # a multi-process run, or on more devices), the arrays land on this process's first device instead
    fallback = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    restored = manager.restore(step, args=ocp.args.Composite(**{
        k: ocp.args.StandardRestore(read, fallback_sharding=fallback) for k, (read, _) in plans.items()}))
    manager.close()
    values = {}
    for item, (_, assemble) in plans.items():
        values.update(assemble(restored[item]))
    if model is None:
        from memllm_jax.model.placement import materialize

        for path, var in nnx.to_flat_state(state):
            key = ".".join(str(k) for k in path)
            if key in values:
                var.set_value(values[key])
        return materialize(graphdef, state)
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        key = ".".join(str(k) for k in path)
        if key in values:
            var.set_value(values[key])
    return model
