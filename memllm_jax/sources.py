"""Any path a user gives for a model, opened the same way by every command.

`identify(path)` says what a path is without importing jax (so a wrong path fails fast, in one line):

- a model checkpoint (`memllm_jax.checkpoint`: `<dir>/<step>/{base,lora,config}`, tokenizer in `<dir>/tokenizer`);
- a training workdir (`train_config.json`): its `model/` checkpoint, or, for runs from before that existed, its
  `params/` directory (the trained parameters only, keyed by pytree path; the base comes from the run's
  `init_checkpoint`). A `params/` directory given directly is read as its workdir;
- an HF directory (`config.json`), or a `.gguf` file / packaged model name (converted once to an HF directory).

`open_model(path)` loads it (LoRA folded into the base unless `merge_lora=False`) and prints one line on stderr
naming what it found. `load_base_into(model, path)` fills a model's base weights from any of them (a training
run's `init_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
from typing import Callable

from memllm_jax.config import MODEL_LAYOUT_FIELDS
from memllm_jax.errors import InputError

CHECKPOINT, WORKDIR, LEGACY, HF, GGUF = "checkpoint", "training workdir", "training workdir (legacy params/)", "HF", "GGUF"


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str
    """One of CHECKPOINT, WORKDIR, LEGACY, HF, GGUF."""
    given: str
    """The path as the user gave it."""
    weights: pathlib.Path
    """The checkpoint directory (CHECKPOINT, WORKDIR: `<workdir>/model`), the workdir (LEGACY), or the HF
    directory (HF; GGUF after conversion)."""
    tokenizer: str | None
    """The tokenizer that belongs to the model, if known."""

    def describe(self) -> str:
        where = f"{self.given}" if str(self.weights) == self.given else f"{self.given} ({self.weights})"
        return f"{self.kind} {where}"


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def _run_tokenizer(workdir: pathlib.Path) -> str | None:
    try:
        tok = json.loads((workdir / "train_config.json").read_text()).get("tokenizer")
    except (OSError, ValueError):
        return None
    return tok if isinstance(tok, str) and tok else None


_KINDS = ("a model checkpoint (<step>/config), a training workdir (train_config.json), an HF directory "
          "(config.json) or a .gguf file")


class _Layout:
    """`memllm_jax.checkpoint`'s layout, read without importing it (it imports jax)."""

    TOKENIZER = "tokenizer"

    @staticmethod
    def is_checkpoint(directory: pathlib.Path) -> bool:
        return directory.is_dir() and any(c.name.isdigit() and (c / "config").exists() for c in directory.iterdir())


def identify(path: str | os.PathLike) -> Source:
    """What `path` is (see the module docstring); InputError when it is none of them."""
    from memllm_jax.model.gguf import PACKAGED, is_gguf, resolve_model_dir

    C = _Layout

    given = str(path)
    if given in PACKAGED or is_gguf(given):
        if given not in PACKAGED and os.path.isdir(given):
            raise InputError(f"{given}: is a directory, not a .gguf file")
        if given not in PACKAGED and not os.path.isfile(given):
            raise InputError(f"{given}: no such file")
        hf = resolve_model_dir(given)
        return Source(GGUF, given, hf, str(hf))
    p = pathlib.Path(given)
    if not p.exists():
        raise InputError(f"{given}: no such file or directory (expected {_KINDS})")
    if p.name == "params" and (p.parent / "train_config.json").exists():  # the legacy export, given directly
        p = p.parent
    if (p / "train_config.json").exists():
        if C.is_checkpoint(p / "model"):
            stored_tok = p / "model" / C.TOKENIZER
            return Source(WORKDIR, given, p / "model", str(stored_tok) if stored_tok.is_dir() else _run_tokenizer(p))
        if (p / "params").is_dir():
            return Source(LEGACY, given, p, _run_tokenizer(p))
        raise InputError(f"{given}: training workdir without a trained model (neither model/ nor params/: "
                         f"the run has not finished)")
    if C.is_checkpoint(p):
        tok = p / C.TOKENIZER
        return Source(CHECKPOINT, given, p, str(tok) if tok.is_dir() else None)
    if (p / "config.json").exists():
        return Source(HF, given, p, str(p) if any((p / f).exists() for f in ("tokenizer.json", "tokenizer.model"))
                      else None)
    raise InputError(f"{given}: not a model (expected {_KINDS})")


# ------------------------------------------------------------------------------------------------ loading


def _single_mesh():
    import jax

    from memllm_jax.config import MeshConfig
    from memllm_jax.sharding import make_mesh

    return make_mesh(MeshConfig(), jax.devices()[:1])


def _hf_vocab(hf_dir: pathlib.Path) -> int:
    from memllm_jax.errors import load_json

    cfg = load_json(hf_dir / "config.json")
    if not isinstance(cfg, dict) or not isinstance(cfg.get("vocab_size"), int):
        raise InputError(f"{hf_dir / 'config.json'}: field vocab_size: missing")
    return cfg["vocab_size"]


def base_reference(init: str, vocab_size: int) -> dict:
    """The `base` entry of an adapter-only checkpoint trained on top of `init` with a `vocab_size` vocabulary."""
    src = identify(init)
    extra = vocab_size - _hf_vocab(src.weights) if src.kind in (HF, GGUF) else 0
    given = init if not os.path.exists(init) else os.path.abspath(init)  # packaged names stay names
    return {"source": given, "extra_tokens": max(0, extra)}


def _plain(model, mesh, seed: int = 0):
    """`model` with its LoRA folded in, as a model without adapter modules."""
    from flax import nnx

    from memllm_jax.model.lora import BASE_PARAMS, merge_lora

    if model.lora_cfg is None:
        return model
    merge_lora(model)
    from memllm_jax.model.placement import create_model

    plain = create_model(model.cfg, None, mesh if mesh is not None else _single_mesh(), seed)
    nnx.update(plain, nnx.state(model, BASE_PARAMS))
    return plain


def _load_checkpoint(directory: pathlib.Path, mesh, step: int | None = None):
    """A model with its stored LoRA (unmerged) from a checkpoint, resolving an adapter-only one's base."""
    from memllm_jax import checkpoint as C
    from memllm_jax.model.placement import abstract_model

    stored = C.read_stored(directory, step)
    if stored.base is None:
        return C.restore_params(directory, abstract_model(stored.model, stored.lora, mesh), stored.step), stored
    model = _base_model(stored.base["source"], stored.model, stored.lora, int(stored.base.get("extra_tokens", 0)),
                        mesh, where=str(directory))
    return C.restore_params(directory, model, stored.step), stored


def _base_model(source: str, cfg, lora, extra_tokens: int, mesh, where: str):
    """A concrete model of `cfg` (+ fresh `lora` adapters) whose base weights come from `source`."""
    try:
        src = identify(source)
    except InputError as exc:
        raise InputError(f"{where}: its base model: {exc}") from None
    if src.kind in (HF, GGUF):
        from memllm_jax.model.hf import load_hf

        _, model = load_hf(src.weights, mesh, lora=lora, extra_tokens=extra_tokens,
                           **{f: getattr(cfg, f) for f in MODEL_LAYOUT_FIELDS})
        if model.cfg.vocab_size != cfg.vocab_size:
            raise InputError(f"{where}: its base {source} has {model.cfg.vocab_size} vocabulary rows, the checkpoint "
                             f"{cfg.vocab_size}")
        return model
    from memllm_jax.model.placement import create_model

    model = create_model(cfg, lora, mesh if mesh is not None else _single_mesh(), 0)
    load_base_into(model, source)
    return model


def load_base_into(model, source: str) -> None:
    """Replace the base weights of the concrete `model` (not its adapters) with those of the model at `source`
    (checkpoint, training workdir or a legacy `params/` directory; shapes must match)."""
    from flax import nnx

    from memllm_jax.model.lora import BASE_PARAMS

    src = identify(source)
    if src.kind == LEGACY and not (src.weights / "train_config.json").exists():
        raise InputError(f"{source}: not a finished training run")
    if src.kind == LEGACY and _legacy_mode(src.weights) == "full":
        abstract = _abstract(nnx.state(model, BASE_PARAMS))
        nnx.update(model, read_legacy_params(src.weights / "params", abstract))
        return
    other, _ = open_model(source, merge_lora=True, say=None, mesh=_mesh_of(model))
    theirs = nnx.state(other, BASE_PARAMS)
    ours = nnx.state(model, BASE_PARAMS)
    a = {k: v.shape for k, v in _flat_shapes(theirs).items()}
    b = {k: v.shape for k, v in _flat_shapes(ours).items()}
    if a != b:
        diff = next((k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)))
        raise InputError(f"{source}: base parameter {diff!r} has shape {a.get(diff)}, the model expects {b.get(diff)}")
    nnx.update(model, theirs)


def build_model(cfg, mesh, vocab_size: int | None = None):
    """The model a training run (`TrainConfig` `cfg`) starts from, on `mesh`: random, or the base weights of
    `cfg.init_checkpoint` (any source above), with fresh adapters in LoRA mode."""
    from memllm_jax.model.gguf import is_gguf, resolve_model_dir
    from memllm_jax.model.placement import create_model

    lora = cfg.lora if cfg.mode == "lora" else None
    init = cfg.init_checkpoint
    if init and (is_gguf(init) or (pathlib.Path(init) / "config.json").exists()):
        from memllm_jax.model.hf import load_hf

        hf_dir = resolve_model_dir(init)  # a .gguf file is converted once to an HF directory
        hf_vocab = _hf_vocab(pathlib.Path(hf_dir))
        extra = max(0, (vocab_size or hf_vocab) - hf_vocab)
        layout = {f: getattr(cfg.model, f) for f in MODEL_LAYOUT_FIELDS if f != "max_seq_len"}
        _, model = load_hf(str(hf_dir), mesh, lora=lora, extra_tokens=extra, seed=cfg.seed, **layout)
        return model
    if vocab_size is not None and vocab_size > cfg.model.vocab_size:
        raise ValueError(f"the tokenizer has {vocab_size} ids but TrainConfig.model.vocab_size={cfg.model.vocab_size}")
    model = create_model(cfg.model, lora, mesh, cfg.seed)
    if init:
        load_base_into(model, init)
    return model


def _flat_shapes(state):
    from flax import nnx

    return {".".join(map(str, path)): var.get_value() for path, var in nnx.to_flat_state(state)}


def _mesh_of(model):
    import jax
    from flax import nnx

    leaf = jax.tree.leaves(nnx.state(model, nnx.Param))[0]
    return getattr(getattr(leaf, "sharding", None), "mesh", None)


def _abstract(tree):
    import jax

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None)), tree)


def _legacy_mode(workdir: pathlib.Path) -> str:
    return json.loads((workdir / "train_config.json").read_text()).get("mode", "full")


def read_legacy_params(directory: str | os.PathLike, abstract_state):
    """Restore a legacy `<workdir>/params` (keys are `jax.tree_util.keystr` paths) into the structure and
    shardings of `abstract_state`; only its keys are read, so the base of a full-model save can be taken alone."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    directory = os.path.abspath(directory)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
    target = {jax.tree_util.keystr(path): leaf for path, leaf in leaves}
    restore_args = {k: ocp.ArrayRestoreArgs(sharding=v.sharding, global_shape=v.shape, dtype=v.dtype)
                    if getattr(v, "sharding", None) is not None else ocp.RestoreArgs(restore_type=np.ndarray)
                    for k, v in target.items()}
    with ocp.PyTreeCheckpointer() as ckptr:
        available = set(ckptr.metadata(directory).item_metadata.tree.keys())
        missing = sorted(set(target) - available)
        if missing:
            raise InputError(f"{directory}: parameters {missing[:3]} missing (different model or LoRA config?)")
        flat = ckptr.restore(directory, args=ocp.args.PyTreeRestore(target, restore_args=restore_args,
                                                                    partial_restore=True))
    return jax.tree_util.tree_unflatten(treedef, [flat[jax.tree_util.keystr(p)] for p, _ in leaves])


def _load_legacy(workdir: pathlib.Path, mesh, tokenizer: str | None):
    """A run from before `<workdir>/model`: rebuild its model from `train_config.json`, read `params/`."""
    import dataclasses as dc

    from flax import nnx

    from memllm_jax.config import MeshConfig
    from memllm_jax.train.config import config_from_json

    cfg = config_from_json(json.loads((workdir / "train_config.json").read_text()))
    mesh = mesh if mesh is not None else _single_mesh()
    cfg = dc.replace(cfg, mesh=MeshConfig(*mesh.devices.shape))
    vocab = None
    if cfg.init_checkpoint and identify(cfg.init_checkpoint).kind in (HF, GGUF):
        from memllm_jax.tokenizer import load_tokenizer

        vocab = load_tokenizer(tokenizer or cfg.tokenizer).vocab_size
    model = build_model(cfg, mesh, vocab)
    trained = nnx.state(model, nnx.LoRAParam if cfg.mode == "lora" else nnx.Param)
    nnx.update(model, read_legacy_params(workdir / "params", _abstract(trained)))
    return model


def open_model(path: str | os.PathLike, *, merge_lora: bool = True, tokenizer: str | os.PathLike | None = None,
               vocab_size: int | None = None, mesh=None, step: int | None = None,
               say: Callable[[str], None] | None = _say):
    """The model at `path` (any kind `identify` knows). With `merge_lora` a LoRA adapter is folded into the base
    and a model without adapter modules is returned. `vocab_size` (an HF base's tokenizer with the API markers
    added): rows appended to an HF model's vocabulary. `say` gets one line naming what was found."""
    src = identify(path)
    if src.kind in (HF, GGUF):
        from memllm_jax.model.hf import load_hf

        hf_vocab = _hf_vocab(src.weights)
        _, model = load_hf(src.weights, mesh, extra_tokens=max(0, (vocab_size or hf_vocab) - hf_vocab))
        note = ""
    elif src.kind == LEGACY:
        model = _load_legacy(src.weights, mesh, None if tokenizer is None else str(tokenizer))
        note = ""
    else:
        model, stored = _load_checkpoint(src.weights, mesh, step)
        note = f", step {stored.step}" + (f", adapter over {stored.base['source']}" if stored.base else "")
    if say is not None:
        adapter = " (LoRA merged)" if merge_lora and model.lora_cfg is not None else ""
        say(f"model: {src.describe()}{note}{adapter}")
    return (_plain(model, mesh) if merge_lora else model), src
