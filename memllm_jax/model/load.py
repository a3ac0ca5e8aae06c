"""Any model path a user gives, opened the same way by every command: `load(path) -> (model, tokenizer)`.

The kinds of path (`identify` tells them apart from the file names alone, so a wrong path fails in one line):

- a model checkpoint (`memllm_jax.checkpoint`: `<dir>/<step>/{base,lora,config}`, tokenizer in `<dir>/tokenizer`);
  an adapter-only one names the model its base weights come from, opened here the same way;
- a training workdir (`train_config.json`): its `model/` checkpoint;
- an HF directory (`config.json`, safetensors, tokenizer files);
- a `.gguf` file or a packaged model name (converted once into a cached HF directory, then read as one).

Each file is read once: the weights' own config, the weights and the tokenizer. A `config` (a preset or any
ModelConfig) given with the path must describe the same architecture as the weights' own config (a
disagreement is an InputError naming the field and both values); its run-time fields (`MODEL_LAYOUT_FIELDS`:
dtypes, layer layout, context bound) are the ones the model gets.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
from typing import Callable

import jax
from flax import nnx

from memllm_jax import checkpoint as C
from memllm_jax.config import MODEL_LAYOUT_FIELDS, LoraConfig, MeshConfig, ModelConfig
from memllm_jax.errors import InputError, load_json
from memllm_jax.model import hf
from memllm_jax.model.gguf import PACKAGED, is_gguf, resolve_model_dir
from memllm_jax.model.lora import BASE_PARAMS, merge_lora
from memllm_jax.model.placement import abstract_model, materialize
from memllm_jax.sharding import make_mesh
from memllm_jax.tokenizer import load_tokenizer

CHECKPOINT, WORKDIR, HF, GGUF = "checkpoint", "training workdir", "HF", "GGUF"

KINDS = ("a model checkpoint (<step>/config), a training workdir (train_config.json and model/), an HF directory "
         "(config.json) or a .gguf file")

ARCHITECTURE_FIELDS = tuple(f.name for f in dataclasses.fields(ModelConfig) if f.name not in MODEL_LAYOUT_FIELDS)
"""The ModelConfig fields that say what a model computes: a config given with weights must agree on each."""


@dataclasses.dataclass(frozen=True)
class Source:
    kind: str
    """One of CHECKPOINT, WORKDIR, HF, GGUF."""
    given: str
    """The path as the user gave it."""
    weights: pathlib.Path
    """The checkpoint directory (CHECKPOINT; WORKDIR: `<workdir>/model`) or the HF directory (HF; GGUF after
    conversion)."""
    tokenizer: pathlib.Path | None
    """The tokenizer stored with the model, if any."""

    def describe(self) -> str:
        where = self.given if str(self.weights) == self.given else f"{self.given} ({self.weights})"
        return f"{self.kind} {where}"


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def identify(path: str | os.PathLike) -> Source:
    """What `path` is (see the module docstring); InputError when it is none of them."""
    given = str(path)
    if given in PACKAGED or is_gguf(given):
        if given not in PACKAGED and os.path.isdir(given):
            raise InputError(f"{given}: is a directory, not a .gguf file")
        if given not in PACKAGED and not os.path.isfile(given):
            raise InputError(f"{given}: no such file")
        directory = resolve_model_dir(given)
        return Source(GGUF, given, directory, directory)
    p = pathlib.Path(given)
    if not p.exists():
        raise InputError(f"{given}: no such file or directory (expected {KINDS})")
    workdir = p.parent if p.name == "params" and (p.parent / "train_config.json").exists() else p
    if (workdir / "train_config.json").exists():
        if workdir == p and C.is_checkpoint(p / "model"):
            tok = p / "model" / C.TOKENIZER
            return Source(WORKDIR, given, p / "model", tok if tok.is_dir() else None)
        if (workdir / "params").is_dir():
            raise InputError(f"{given}: a training workdir of the old params/ layout, which is no longer read "
                             f"(expected {KINDS})")
        raise InputError(f"{given}: training workdir without a trained model (no model/: the run has not finished)")
    if C.is_checkpoint(p):
        tok = p / C.TOKENIZER
        return Source(CHECKPOINT, given, p, tok if tok.is_dir() else None)
    if (p / "config.json").exists():
        has_tok = any((p / f).exists() for f in ("tokenizer.json", "tokenizer.model"))
        return Source(HF, given, p, p if has_tok else None)
    raise InputError(f"{given}: not a model (expected {KINDS})")


def load(path: str | os.PathLike, *, tokenizer=None, need_tokenizer: bool = False, config: ModelConfig | None = None,
         dtype: str | None = None, lora: LoraConfig | None = None, merge_lora: bool = True,
         extra_tokens: int | None = None, step: int | None = None, base: str | None = None, mesh=None,
         seed: int = 0, say: Callable[[str], None] | None = _say):
    """`(model, tokenizer)` from the model at `path` (any kind `identify` knows); one line on stderr (`say`)
    names what was found.

    `tokenizer`: a loaded tokenizer or a tokenizer path; None: the one stored with the model (None when there is
    none, an InputError with `need_tokenizer`, before any weight is read). An HF / GGUF base gets `extra_tokens`
    vocabulary rows appended (mean-initialised), by default as many as the tokenizer's added API markers need.
    `config`: a ModelConfig the weights must agree with (see the module docstring); `dtype`: the parameter dtype.
    `merge_lora`: a stored LoRA adapter is folded into the base and a model without adapter modules returned;
    `lora`: fresh adapters (seeded by `seed`) on top of the (merged) weights, as a LoRA training run starts.
    `step`: a checkpoint's earlier step (default the latest). `base`: the model an adapter-only checkpoint was
    trained on, when it names none (or another copy of the one it names). `mesh`: where the parameters go
    (default: one device)."""
    src = identify(path)
    own = _own_config(src, step)  # before the tokenizer is read: a damaged config file names itself
    tok = tokenizer if tokenizer is not None else src.tokenizer
    if tok is None and need_tokenizer:
        raise InputError(f"{path}: no tokenizer stored with this {src.kind} model; pass --tokenizer")
    if isinstance(tok, (str, os.PathLike)):
        tok = load_tokenizer(tok)
    vocab = getattr(tok, "vocab_size", None)
    if isinstance(own, C.Stored):  # before the weights are read (an HF base gets the rows the tokenizer needs)
        _check_vocab(tok, own.model.vocab_size, path)
    model, note, adapter = _weights(src, own, vocab, config, dtype, lora, merge_lora, extra_tokens, base, mesh, seed)
    _check_vocab(tok, model.cfg.vocab_size, path)
    if say is not None:
        say(f"model: {src.describe()}{note}" + (" (LoRA merged)" if adapter and merge_lora and lora is None else ""))
    return model, tok


def _check_vocab(tok, rows: int, path) -> None:
    vocab = getattr(tok, "vocab_size", None)
    if vocab is not None and vocab > rows:
        raise InputError(f"{getattr(tok, 'path', None) or tok}: tokenizer has {vocab} ids but the model {path} only "
                         f"{rows}")


def _own_config(src: Source, step: int | None):
    """What the weights say of themselves: an HF directory's `config.json` (a dict), a checkpoint's `Stored`
    configs (of `step`, default the latest)."""
    if src.kind in (HF, GGUF):
        return _json_object(src.weights / "config.json")
    return C.read_stored(src.weights, step)


def _weights(src: Source, own, vocab, config, dtype, lora, merge, extra_tokens, base, mesh, seed, init_rest=True):
    """`(model, note, adapter)`: the model of `src` (whose own config is `own`), what the stderr line adds,
    whether a stored LoRA adapter was there. `init_rest=False`: an HF / GGUF model comes as `(graphdef, state)`
    with the adapters `lora` left abstract (`hf.load_hf_weights`), a restore target for a stored adapter."""
    if src.kind in (HF, GGUF):
        where = src.given if src.kind == GGUF else str(src.weights / "config.json")
        own = hf.config_from_hf(own, where)
        extra = extra_tokens if extra_tokens is not None else max(0, (vocab or own.vocab_size) - own.vocab_size)
        cfg = _settle(own, config, dtype, extra, where)
        model = hf.load_hf_weights(src.weights, cfg, mesh, lora=lora, extra_tokens=extra, seed=seed,
                                   init_rest=init_rest)
        return model, "", False
    stored = own
    cfg = _settle(stored.model, config, dtype, 0, f"{src.weights} (step {stored.step})")
    mesh = mesh if mesh is not None else _one_device()  # not the stored sharding: base and adapters on one device
    note = f", step {stored.step}"
    ref = {"source": base, "extra_tokens": (stored.base or {}).get("extra_tokens")} if base else stored.base
    if ref is None:
        model = C.restore_params(src.weights, abstract_model(cfg, stored.lora, mesh), stored.step)
    else:
        note += f", adapter over {ref['source']}"
        try:
            base_src = identify(ref["source"])
        except InputError as exc:
            raise InputError(f"{src.weights}: its base model: {exc}") from None
        extra = ref.get("extra_tokens")  # None (a base given here): the rows the checkpoint has beyond the base's
        # the base's restore target: its weights read, the adapters `stored.lora` left for the checkpoint to fill
        under, _, _ = _weights(base_src, _own_config(base_src, None), vocab=cfg.vocab_size, config=cfg, dtype=None,
                               lora=stored.lora, merge=True, extra_tokens=None if extra is None else int(extra),
                               base=None, mesh=mesh, seed=0, init_rest=False)
        model = C.restore_params(src.weights, under, stored.step)
    adapter = model.lora_cfg is not None
    if adapter and (merge or lora is not None):
        merge_lora(model)
        model = _rebuild(model, lora, mesh, seed)
    elif lora is not None:
        model = _rebuild(model, lora, mesh, seed)
    return model, note, adapter


def _settle(own: ModelConfig, config: ModelConfig | None, dtype: str | None, extra: int, where: str) -> ModelConfig:
    """The weights' own architecture `own` with the run-time fields of `config` (an InputError naming the field
    when `config` describes another architecture; its vocabulary may count the `extra` appended rows)."""
    if config is not None:
        for field in ARCHITECTURE_FIELDS:
            theirs, ours = getattr(own, field), getattr(config, field)
            if theirs != ours and not (field == "vocab_size" and ours == theirs + extra):
                raise InputError(f"{where}: {field} is {theirs!r} in the weights' config but {ours!r} in the model "
                                 f"config given")
        own = dataclasses.replace(own, **{f: getattr(config, f) for f in MODEL_LAYOUT_FIELDS})
    return own if dtype is None else dataclasses.replace(own, param_dtype=dtype)


def _json_object(path: pathlib.Path) -> dict:
    value = load_json(path)
    if not isinstance(value, dict):
        raise InputError(f"{path}: expected a JSON object")
    return value


def _rebuild(model, lora: LoraConfig | None, mesh, seed: int):
    """A model of `model.cfg` with adapters `lora` (None: none) whose base parameters are `model`'s; the rest
    (adapters, RNG state) initialised fresh from `seed`."""
    mesh = mesh if mesh is not None else _one_device()
    graphdef, abstract = abstract_model(model.cfg, lora, mesh, seed)
    base = dict(nnx.to_flat_state(nnx.state(model, BASE_PARAMS)))
    for path, var in nnx.to_flat_state(abstract):
        if path in base:
            var.set_value(base[path].get_value())
    return materialize(graphdef, abstract, seed)


def _one_device():
    return make_mesh(MeshConfig(), jax.devices()[:1])


def base_reference(init: str, vocab_size: int) -> dict:
    """The `base` entry of an adapter-only checkpoint trained on top of the model at `init` with a `vocab_size`
    vocabulary (`memllm_jax.checkpoint`)."""
    src = identify(init)
    extra = 0
    if src.kind in (HF, GGUF):
        extra = vocab_size - hf.config_from_hf(_json_object(src.weights / "config.json")).vocab_size
    given = init if not os.path.exists(init) else os.path.abspath(init)  # packaged names stay names
    return {"source": given, "extra_tokens": max(0, extra)}
