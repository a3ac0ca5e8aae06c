"""Hugging Face interop: load / save an HF Mistral directory, export a LoRA adapter in PEFT format.

The mapping is data (`param_mapping`): our parameter path (+ the row of its leading layer axis when the
layers are scanned) -> HF tensor name + the number of input axes of our kernel (HF linear weights are
`[out, in]`; ours are `in_shape + out_shape`). Loading reads one tensor at a time from the safetensors
file(s) and places it straight into its target sharding (a scanned layer: into its row of the stacked array).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.errors import InputError, load_json
from memllm_jax.files import atomic_write_json

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
PEFT_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "gate": "gate_proj", "up": "up_proj",
              "down": "down_proj", "lm_head": "lm_head"}


@dataclasses.dataclass(frozen=True)
class Entry:
    ours: tuple[str, ...]
    """Path in our nnx state (strings; layer indices as ints)."""
    hf: str
    """HF tensor name."""
    n_in: int | None
    """Linear kernels: number of our input axes (the weight is transposed and reshaped); None: copied as is."""
    layer: int | None = None
    """Scanned layers (`ModelConfig.scan_layers`): the row of the leading layer axis of `ours` that this HF
    tensor is; None: `ours` is the whole array."""


def layer_path(cfg: ModelConfig, i: int) -> tuple[tuple, int | None]:
    """`(path prefix, layer row)` of decoder layer i: `(("layers",), i)` scanned, `(("layers", i), None)` not."""
    return (("layers",), i) if cfg.scan_layers else (("layers", i), None)


def param_mapping(cfg: ModelConfig) -> list[Entry]:
    m = [Entry(("embed",), "model.embed_tokens.weight", None)]
    for i in range(cfg.n_layers):
        (p, row), h = layer_path(cfg, i), f"model.layers.{i}."
        m += [
            Entry((*p, "attn_norm", "scale"), h + "input_layernorm.weight", None, row),
            Entry((*p, "attn", "q", "kernel"), h + "self_attn.q_proj.weight", 1, row),
            Entry((*p, "attn", "k", "kernel"), h + "self_attn.k_proj.weight", 1, row),
            Entry((*p, "attn", "v", "kernel"), h + "self_attn.v_proj.weight", 1, row),
            Entry((*p, "attn", "o", "kernel"), h + "self_attn.o_proj.weight", 2, row),
            Entry((*p, "mlp_norm", "scale"), h + "post_attention_layernorm.weight", None, row),
            Entry((*p, "mlp", "gate", "kernel"), h + "mlp.gate_proj.weight", 1, row),
            Entry((*p, "mlp", "up", "kernel"), h + "mlp.up_proj.weight", 1, row),
            Entry((*p, "mlp", "down", "kernel"), h + "mlp.down_proj.weight", 1, row),
        ]
    m.append(Entry(("final_norm", "scale"), "model.norm.weight", None))
    if not cfg.tie_embeddings:
        m.append(Entry(("lm_head", "kernel"), "lm_head.weight", 1))
    return m


def to_ours(hf_array: np.ndarray, entry: Entry, shape: tuple[int, ...]) -> np.ndarray:
    if entry.n_in is None:
        return hf_array
    return np.ascontiguousarray(hf_array.T).reshape(shape)


def to_hf(array: np.ndarray, entry: Entry) -> np.ndarray:
    if entry.n_in is None:
        return array
    n_in = math.prod(array.shape[: entry.n_in])
    return np.ascontiguousarray(array.reshape(n_in, -1).T)


# ---- config ---------------------------------------------------------------------------------------------


def config_from_hf(hf: dict, where: str = "config.json", **overrides) -> ModelConfig:
    """ModelConfig from an HF Mistral `config.json` dict (old top-level `rope_theta` or `rope_parameters`)."""

    def need(key):
        if key not in hf:
            raise InputError(f"{where}: missing field {key!r}")
        return hf[key]

    if hf.get("model_type", "mistral") not in ("mistral", "llama"):
        raise InputError(f"{where}: field 'model_type' is {hf.get('model_type')!r}, expected 'mistral'")
    if hf.get("hidden_act", "silu") != "silu":
        raise InputError(f"{where}: field 'hidden_act' is {hf['hidden_act']!r}, only 'silu' is supported")
    rope = hf.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or hf.get("rope_scaling"):
        raise InputError(f"{where}: field 'rope_parameters'/'rope_scaling': only default RoPE is supported")
    heads = need("num_attention_heads")
    dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "float32")
    cfg = ModelConfig(
        vocab_size=need("vocab_size"),
        d_model=need("hidden_size"),
        n_layers=need("num_hidden_layers"),
        n_heads=heads,
        n_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or need("hidden_size") // heads,
        d_ff=need("intermediate_size"),
        sliding_window=hf.get("sliding_window"),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        max_seq_len=int(hf.get("max_position_embeddings", 32768)),
        param_dtype=dtype if dtype in ("float32", "bfloat16") else "float32",
        compute_dtype=dtype if dtype in ("float32", "bfloat16") else "float32",
    )
    return dataclasses.replace(cfg, **overrides)


def config_to_hf(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "sliding_window": cfg.sliding_window,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_dropout": 0.0,
        "dtype": cfg.param_dtype,
        "use_cache": True,
    }


# ---- reading ------------------------------------------------------------------------------------------


class _Reader:
    """Tensor-by-tensor access to `model.safetensors` or a sharded set with its index file, each file opened
    once (a context manager: leaving it closes them)."""

    def __init__(self, directory: pathlib.Path):
        from safetensors import safe_open

        self._open = safe_open
        self._stack = contextlib.ExitStack()
        self._keys: dict[pathlib.Path, set[str]] = {}
        self._handles: dict[pathlib.Path, object] = {}
        self.files: dict[str, pathlib.Path] = {}
        index = directory / INDEX_FILE
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError) as e:
                raise InputError(f"{index}: not a safetensors index (needs a 'weight_map' object): {e}") from None
            for name, fname in weight_map.items():
                path = directory / fname
                if not path.exists():
                    raise FileNotFoundError(f"{index}: tensor {name!r} is in {fname}, which does not exist")
                self.files[name] = path
        elif (directory / SINGLE_FILE).exists():
            self.files = dict.fromkeys(self._handle(directory / SINGLE_FILE)[1], directory / SINGLE_FILE)
        else:
            raise FileNotFoundError(f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE} exists")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _handle(self, path: pathlib.Path):
        if path not in self._handles:
            self._handles[path] = self._stack.enter_context(self._open(path, framework="numpy"))
            self._keys[path] = set(self._handles[path].keys())
        return self._handles[path], self._keys[path]

    def get(self, name: str) -> np.ndarray:
        if name not in self.files:
            raise KeyError(f"{name!r} is missing from the safetensors file(s) in {next(iter(self.files.values())).parent}")
        f, keys = self._handle(self.files[name])
        if name not in keys:
            raise KeyError(f"{self.files[name]}: tensor {name!r} listed in the index is not in the file")
        return f.get_tensor(name)


def _get_path(tree, path):
    for key in path:
        tree = tree[key]
    return tree


@functools.partial(jax.jit, donate_argnums=0)
def _set_row(stacked, row_array, i):
    return jax.lax.dynamic_update_index_in_dim(stacked, row_array.astype(stacked.dtype), i, 0)


def _place(state, sh, entry: Entry, array: np.ndarray) -> None:
    """Put `array` into `state` at `entry.ours` (its row `entry.layer` of a stacked array, in place)."""
    parent, key, sharding = _get_path(state, entry.ours[:-1]), entry.ours[-1], _get_path(sh, entry.ours)
    if entry.layer is None:
        parent[key] = jax.device_put(array, sharding)
        return
    if isinstance(parent[key], jax.ShapeDtypeStruct):  # the first row: allocate the stack in its sharding
        shape, dtype = parent[key].shape, parent[key].dtype
        parent[key] = jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)()
    from memllm_jax.sharding import row_sharding

    parent[key] = _set_row(parent[key], jax.device_put(array, row_sharding(sharding)), entry.layer)


def load_hf(
    directory: str | os.PathLike,
    mesh=None,
    *,
    lora: LoraConfig | None = None,
    extra_tokens: int = 0,
    seed: int = 0,
    **config_overrides,
):
    """`(ModelConfig, Decoder)` from an HF Mistral directory, each tensor placed into its target sharding.

    `extra_tokens` appends that many embedding / LM-head rows initialised to the mean row (for added special
    tokens). `config_overrides` replace ModelConfig fields (e.g. `param_dtype="bfloat16"`).
    """
    directory = pathlib.Path(directory)
    config_path = directory / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{config_path} does not exist")
    hf_cfg = load_json(config_path)
    if not isinstance(hf_cfg, dict):
        raise InputError(f"{config_path}: expected a JSON object")
    cfg = config_from_hf(hf_cfg, str(config_path), **config_overrides)
    model = load_hf_weights(directory, cfg, mesh, lora=lora, extra_tokens=extra_tokens, seed=seed)
    return model.cfg, model


def load_hf_weights(directory: str | os.PathLike, cfg: ModelConfig, mesh=None, *, lora: LoraConfig | None = None,
                    extra_tokens: int = 0, seed: int = 0, init_rest: bool = True):
    """The `Decoder` of `cfg` (the directory's own `config.json`, as `config_from_hf` reads it, with any run-time
    fields set) with the weights of the HF directory; see `load_hf`. `init_rest=False`: `(graphdef, state)` with
    what the HF file lacks (the adapters of `lora`) left abstract, a target for `checkpoint.restore_params` to fill
    from a stored adapter (no fresh adapters drawn only to be overwritten)."""
    from memllm_jax.model.placement import abstract_model, materialize
    from memllm_jax.sharding import check_fits, state_shardings

    directory = pathlib.Path(directory)
    base_vocab = cfg.vocab_size
    cfg = dataclasses.replace(cfg, vocab_size=base_vocab + extra_tokens)
    if mesh is not None:
        check_fits(cfg, mesh)
    with _Reader(directory) as reader:
        graphdef, abstract = abstract_model(cfg, lora, None, seed)
        if mesh is None:
            from jax.sharding import SingleDeviceSharding

            shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), abstract)
        else:
            shardings = state_shardings(abstract, mesh)
        state = nnx.to_pure_dict(abstract)
        sh = nnx.to_pure_dict(shardings)
        for entry in param_mapping(cfg):
            target = _get_path(state, entry.ours)
            our_shape = tuple(target.shape)[int(entry.layer is not None):]
            if entry.ours == ("embed",):
                our_shape = (base_vocab, cfg.d_model)
            elif entry.ours == ("lm_head", "kernel"):
                our_shape = (cfg.d_model, base_vocab)
            n_in = entry.n_in
            expected_hf = our_shape if n_in is None else (math.prod(our_shape[n_in:]), math.prod(our_shape[:n_in]))
            array = reader.get(entry.hf)
            if tuple(array.shape) != expected_hf:
                raise InputError(
                    f"{reader.files[entry.hf]}: tensor {entry.hf!r} has shape {tuple(array.shape)}, "
                    f"but config.json implies {expected_hf}"
                )
            array = to_ours(array, entry, our_shape)
            if extra_tokens and entry.ours[0] in ("embed", "lm_head"):
                axis = 0 if entry.ours[0] == "embed" else 1
                mean = array.astype(np.float32).mean(axis=axis, keepdims=True).astype(array.dtype)
                array = np.concatenate([array, np.repeat(mean, extra_tokens, axis=axis)], axis=axis)
            _place(state, sh, entry, array.astype(target.dtype))
    # Everything not in the HF file (LoRA adapters, RNG state) is initialised fresh, into its sharding.
    for path, var in nnx.to_flat_state(abstract):
        value = _get_path(state, path)
        if isinstance(value, jax.ShapeDtypeStruct):
            value = jax.ShapeDtypeStruct(value.shape, value.dtype, sharding=_get_path(sh, path))
        var.set_value(value)
    return materialize(graphdef, abstract, seed) if init_rest else (graphdef, abstract)


# ---- writing ------------------------------------------------------------------------------------------


def _save_safetensors(tensors: dict[str, np.ndarray], path: pathlib.Path, metadata=None) -> None:
    from safetensors.numpy import save_file

    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata or {"format": "pt"})
    os.replace(tmp, path)


def hf_tensors(model, *, merge_lora: bool = False):
    """Yield `(hf_name, numpy array)` for the base weights (LoRA folded in when `merge_lora`)."""
    from memllm_jax.model.lora import BASE_PARAMS, lora_modules

    cfg = model.cfg
    state = nnx.to_pure_dict(nnx.state(model, BASE_PARAMS))
    adapters = {tuple(path) + ("kernel",): linear.lora for path, linear in lora_modules(model)} if merge_lora else {}
    token_lora = getattr(model, "token_lora", None)
    for entry in param_mapping(cfg):
        value = _get_path(state, entry.ours)
        if entry.layer is not None:
            value = value[entry.layer]
        if entry.ours in adapters:
            delta = adapters[entry.ours].delta(entry.layer)
            value = (value.astype(jnp.float32) + delta).astype(value.dtype)
        if merge_lora and entry.ours == ("embed",) and token_lora is not None:
            value = token_lora.merged_embedding(value)
        yield entry.hf, to_hf(np.asarray(jax.device_get(value)), entry)


def save_hf(model, directory: str | os.PathLike, *, merge_lora: bool = False, max_shard_bytes: int = 5 << 30) -> None:
    """Write `config.json` and `model.safetensors` (or shards + index when larger than `max_shard_bytes`)."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, array in hf_tensors(model, merge_lora=merge_lora):
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    if len(shards) == 1:
        _save_safetensors(shards[0], directory / SINGLE_FILE)
        (directory / INDEX_FILE).unlink(missing_ok=True)
    else:
        weight_map, total = {}, 0
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _save_safetensors(shard, directory / fname)
            weight_map.update({name: fname for name in shard})
            total += sum(a.nbytes for a in shard.values())
        atomic_write_json(directory / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2,
                          sort_keys=True)
        (directory / SINGLE_FILE).unlink(missing_ok=True)
    atomic_write_json(directory / "config.json", config_to_hf(model.cfg), indent=2, sort_keys=True)


def save_peft_adapter(model, directory: str | os.PathLike, base_model_name_or_path: str | None = None) -> None:
    """Write `adapter_config.json` + `adapter_model.safetensors` that HF PEFT loads onto the HF base model."""
    from memllm_jax.model.lora import lora_modules

    lora_cfg: LoraConfig | None = model.lora_cfg
    if lora_cfg is None:
        raise ValueError("save_peft_adapter: the model has no LoRA adapters (LoraConfig is None)")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path, linear in lora_modules(model):
        path = tuple(path)
        a_all = np.asarray(jax.device_get(linear.lora.a[...]))
        b_all = np.asarray(jax.device_get(linear.lora.b[...]))
        if path[0] == "lm_head":
            rows = [("base_model.model.lm_head", a_all, b_all)]
        else:
            block, name = path[-2], path[-1]
            sub = "self_attn" if block == "attn" else "mlp"
            layers = range(model.cfg.n_layers) if model.cfg.scan_layers else [path[1]]
            rows = [(f"base_model.model.model.layers.{i}.{sub}.{PEFT_NAMES[name]}",
                     a_all[i] if model.cfg.scan_layers else a_all, b_all[i] if model.cfg.scan_layers else b_all)
                    for i in layers]
        for prefix, a, b in rows:
            tensors[prefix + ".lora_A.weight"] = np.ascontiguousarray(a.reshape(-1, a.shape[-1]).T)
            tensors[prefix + ".lora_B.weight"] = np.ascontiguousarray(b.reshape(b.shape[0], -1).T)
    token_lora = getattr(model, "token_lora", None)
    if token_lora is not None:
        # PEFT stores the full values of the trained rows, not a delta.
        rows = np.asarray(jax.device_get(token_lora.merged_embedding(model.embed[...])))[list(token_lora.token_ids)]
        tensors["base_model.model.model.embed_tokens.token_adapter.trainable_tokens_delta"] = rows
    _save_safetensors(tensors, directory / "adapter_model.safetensors")
    atomic_write_json(directory / "adapter_config.json", {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": lora_cfg.rank,
        "lora_alpha": lora_cfg.alpha,
        "lora_dropout": lora_cfg.dropout,
        "target_modules": sorted(PEFT_NAMES[t] for t in lora_cfg.targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "use_rslora": False,
        "use_dora": False,
        "trainable_token_indices": {"embed_tokens": list(lora_cfg.trainable_tokens)} if lora_cfg.trainable_tokens else None,
    }, indent=2, sort_keys=True)
