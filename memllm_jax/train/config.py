"""`TrainConfig`: everything a training run needs, as one frozen, overridable value.

Experiment files (`experiments/configs/*.py`) return one from `get_config()`; the command line changes fields
with `--set a.b=c` (`memllm_jax.settings.override`), and `memllm_jax.settings.check_tree` checks every field.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from memllm_jax.config import DEFAULT_TINY, MODEL_LAYOUT_FIELDS, LoraConfig, MeshConfig, ModelConfig
from memllm_jax.errors import InputError
from memllm_jax.settings import check_tree


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    name: str = "train"
    """Run name (used in log lines and TensorBoard)."""
    model: ModelConfig = DEFAULT_TINY
    """The decoder architecture (also sets `compute_dtype` for bf16 compute and `remat`)."""
    lora: LoraConfig | None = None
    """Adapters added to the model; required when `mode` is "lora"."""
    mesh: MeshConfig = MeshConfig()
    """Device mesh; the global batch is split over `data * fsdp`."""
    mode: str = "full"
    """"full": train every parameter (the tiny base); "lora": train the `nnx.LoRAParam` leaves only, with
    optimizer state for them only, and checkpoint only them."""

    train_markers: bool = False
    """LoRA mode: also train the embedding rows of the tokenizer's API-marker ids (added to
    `lora.trainable_tokens` at run time) - needed when the markers were added to a pretrained vocabulary."""

    train_data: tuple[str, ...] = ()
    """JSONL files of training records (`segments` with loss flags; docs/interfaces.md)."""
    eval_data: tuple[str, ...] = ()
    """JSONL files of held-out records; empty = hold out `eval_fraction` of `train_data`."""
    eval_fraction: float = 0.05
    """Share of `train_data` held out when `eval_data` is empty (0 disables evaluation then)."""
    tokenizer: str = ""
    """Tokenizer path for `memllm_jax.tokenizer.load_tokenizer` (our tokenizer.json or an HF directory)."""
    seq_len: int = 256
    """Model input length of a row; longer examples are truncated from the left, keeping the loss span."""
    packing: str = "pad"
    """"pad": one example per row with length buckets; "pack": concatenate examples into full rows (a token
    stream, for pretraining); "pack_examples": whole examples share rows, attention kept within each;
    "pack_prefixes": as "pack_examples", with a prefix that examples share laid out once (`train.data`)."""
    buckets: tuple[int, ...] = ()
    """Row lengths for "pad" (each batch uses the smallest that fits); empty = powers of two up to seq_len."""

    global_batch: int = 32
    """Rows per optimizer step (over all devices and micro-batches)."""
    micro_batches: int = 1
    """Gradient accumulation: the global batch is run as this many sequential micro-batches."""
    steps: int | None = None
    """Optimizer steps; None = derive from `epochs`."""
    epochs: float | None = 1.0
    """Passes over the training data when `steps` is None."""

    lr: float = 3e-4
    """Peak learning rate."""
    lora_b_lr_ratio: float = 1.0
    """LoRA+ (Hayou et al., 2024): the adapters' B matrices learn at `lr` times this ratio, their A matrices and the
    trained token rows at `lr`; the LoRA+ paper suggests ~16 for LoRA finetuning of LLMs. 1.0 is plain LoRA."""
    warmup_steps: int = 0
    """Linear warmup from 0 to `lr`."""
    schedule: str = "cosine"
    """Decay after warmup: "cosine", "linear" or "constant"."""
    end_lr_fraction: float = 0.1
    """Final learning rate as a fraction of `lr` (cosine and linear)."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay (applied to matrices only, not to norm scales)."""
    b1: float = 0.9
    """Adam beta1."""
    b2: float = 0.999
    """Adam beta2."""
    eps: float = 1e-8
    """Adam epsilon."""
    clip_norm: float | None = 1.0
    """Clip the global gradient norm to this value; None disables clipping."""

    eval_every: int = 0
    """Evaluate the held-out loss every this many steps (also before the first step and at the end);
    0 = only at the end."""
    eval_batch: int = 32
    """Rows per evaluation batch."""
    eval_max_examples: int | None = None
    """Use at most this many held-out examples (None = all)."""
    log_every: int = 10
    """Write a metrics line every this many steps."""

    workdir: str = "runs/train"
    """Directory for checkpoints (`ckpt/`), metrics (`metrics.jsonl`, `tb/`), the loss plot and final params."""
    checkpoint_every: int = 0
    """Save the train state every this many steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = 2
    """Number of most recent train-state checkpoints kept."""
    sparse_head: bool = True
    """Run the LM head (d_model x vocab and its softmax) only at the loss positions of each batch shard
    (`train.step.HEAD_FIELDS`): the same loss and gradients, less work when the loss covers part of the
    tokens (API spans); False: logits at every position."""
    export_steps: tuple[int, ...] = ()
    """Steps at which the trained model is also exported, as earlier steps of `<workdir>/model` (a skill metric
    measured along one run gives its learning curve, e.g. memory-write precision against steps)."""
    async_checkpoint: bool = True
    """Write checkpoints in the background while training continues."""
    resume: bool = True
    """Continue from the latest checkpoint in `workdir` when there is one."""

    seed: int = 0
    """Seed of the parameter initialisation (full mode) and of LoRA init and dropout."""
    data_seed: int = 0
    """Seed of the shuffling (a run's batches are a pure function of it and the step)."""
    init_checkpoint: str | None = None
    """Base parameters to start from: a `memllm_jax.checkpoint` directory (e.g. the tiny base run's
    `params/`) or an HF model directory; None = random initialisation (pretraining)."""
    compilation_cache: str | None = None
    """Directory of JAX's persistent compilation cache, shared between runs (the memory-read adapter then
    reuses the compiled steps of the memory-write adapter); a relative path is taken relative to the parent of
    `workdir`; None leaves the process's setting alone."""
    progress: bool = True
    """Show a tqdm progress bar (loss, tokens/s, ETA)."""

    BOUNDS: ClassVar[dict] = {
        **{f: "positive" for f in ("seq_len", "buckets", "global_batch", "micro_batches", "steps", "epochs", "lr",
                                   "lora_b_lr_ratio", "eps", "clip_norm", "eval_batch", "eval_max_examples",
                                   "log_every", "keep_checkpoints", "export_steps")},
        **{f: "nonnegative" for f in ("warmup_steps", "weight_decay", "eval_every", "checkpoint_every", "seed",
                                      "data_seed")},
        "eval_fraction": (0.0, 0.9), "end_lr_fraction": "fraction", "b1": (0.0, 0.9999), "b2": (0.0, 0.9999)}
    CHOICES: ClassVar[dict] = {"mode": ("full", "lora"), "schedule": ("cosine", "linear", "constant"),
                               "packing": ("pad", "pack", "pack_examples", "pack_prefixes")}

    def check(self) -> None:
        """Rules across fields (each field's own type and range are checked by `settings.check_tree`)."""
        if self.mode == "lora" and self.lora is None:
            raise InputError("lora=None: mode='lora' needs LoRA settings")
        if self.global_batch % self.micro_batches:
            raise InputError(f"micro_batches={self.micro_batches}: must divide global_batch={self.global_batch}")
        if self.lora_b_lr_ratio != 1.0 and self.mode != "lora":
            raise InputError(f"lora_b_lr_ratio={self.lora_b_lr_ratio}: needs mode='lora' (got {self.mode!r})")
        if self.steps is None and self.epochs is None:
            raise InputError("steps=None: set steps or epochs")
        if self.seq_len > self.model.max_seq_len:
            raise InputError(f"seq_len={self.seq_len}: exceeds model.max_seq_len={self.model.max_seq_len}")


RUN_FIELDS = ("name", "mesh", "micro_batches", "eval_every", "eval_batch", "eval_max_examples", "log_every",
              "workdir", "checkpoint_every", "keep_checkpoints", "sparse_head", "export_steps", "async_checkpoint",
              "resume", "compilation_cache", "progress")
"""The `TrainConfig` fields that choose how a run is carried out (devices, memory, logging, checkpoints), not
what it trains: a run may resume under other values of these (e.g. on another mesh). With `model`'s
`MODEL_LAYOUT_FIELDS` they are the only fields `resume_conflicts` lets differ."""


def resume_conflicts(saved: dict, cfg: TrainConfig) -> list[str]:
    """The fields, as `a.b=old -> new`, in which `cfg` trains something other than the run whose
    `train_config.json` is `saved` (empty when `cfg` may resume it)."""
    now = dataclasses.asdict(cfg)
    defaults = dataclasses.asdict(TrainConfig())
    conflicts = []
    for field in sorted(set(now) | set(saved)):
        if field in RUN_FIELDS:
            continue
        old, new = saved.get(field, defaults.get(field)), now.get(field)  # a field added since: it trained as its default
        if field == "model":
            old, new = ({k: v for k, v in (d or {}).items() if k not in MODEL_LAYOUT_FIELDS} for d in (old, new))
        if _comparable(old) != _comparable(new):
            if isinstance(old, dict) and isinstance(new, dict):
                conflicts += [f"{field}.{k}={old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                              if _comparable(old.get(k)) != _comparable(new.get(k))]
            else:
                conflicts.append(f"{field}={old!r} -> {new!r}")
    return conflicts


def _comparable(value):
    """JSON's lists and the config's tuples compare equal."""
    if isinstance(value, (list, tuple)):
        return [_comparable(v) for v in value]
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


def validate(cfg: TrainConfig) -> None:
    """Raise an `InputError` naming the setting when `cfg` cannot run: any field out of its range (`check_tree`),
    or no data or tokenizer given."""
    check_tree(cfg)
    if not cfg.train_data:
        raise InputError("setting train_data=(): no training data")
    if not cfg.tokenizer:
        raise InputError("setting tokenizer='': no tokenizer")
