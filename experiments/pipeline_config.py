"""The main job's settings (`PipelineConfig`), its stages and what each depends on, and the stage keys.

A stage's key is a hash of the settings it depends on and of those of every stage upstream of it (for the
training stages, the resolved training config's contents): `experiments.pipeline.Pipeline` skips a stage whose
stamp holds its key, so a run resumes where it stopped and a changed setting redoes exactly what it affects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable

STAGES = ("corpus", "tokenizer", "pretrain", "mw", "mr", "memory", "diagnostics", "table2", "editing", "scaling", "report")


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    name: str = "default"
    """Run name (shown in the report)."""
    corpus: str = "synthetic"
    """"synthetic" (generated here) or a DocRED-format JSON file (e.g. Re-DocRED test) split into train and
    held-out evaluation documents."""
    synth_docs: int = 1500
    """Synthetic documents generated (train + eval + outside)."""
    synth_seed: int = 0
    """Seed of the synthetic world and documents."""
    eval_corpus: str = ""
    """A second DocRED-format JSON file whose last `eval_docs` (+ `outside_docs`) documents are the evaluation
    (and outside) documents, while every document of `corpus` trains (e.g. Re-DocRED train as `corpus` and
    Re-DocRED test as `eval_corpus`, the paper's split); "" = split `corpus` itself."""
    heldout_world: bool = True
    """Synthetic corpus only: the evaluation and outside documents come from a second world that shares no entity
    with the training documents' world, so the base model cannot know their facts and only memory can supply
    them (False: one shared world, the facts recur across training and evaluation documents)."""
    labels: str = ""
    """Relation labels file for a DocRED corpus ("" = the synthetic labels / data_gen's default)."""
    eval_docs: int = 40
    """Documents held out for evaluation (the last ones of the corpus)."""
    outside_docs: int = 0
    """Documents (before the evaluation ones) written by the MW model for rows ① (all) and ② (a quarter);
    0 skips those rows."""
    train_docs: int = 0
    """Training documents used: the first this many of those left after the evaluation and outside documents
    (0: every one). For learning curves against the amount of training text, e.g. the memory-write F1 with a
    quarter, half and all of a corpus's training documents (scale the adapters' steps with it)."""
    write_context_free: int = 0
    """Extra memory-write training examples per training document: one later sentence with its pretext dropped
    (`data_gen.write_examples.context_free_items`). Without them the only lone sentences the model sees are
    documents' first sentences, and it writes a biography's opening facts for any lone sentence about a person."""
    write_evidence: bool = False
    """A memory-write training example's targets are only the triples its sentence is evidence for (annotated, or
    for an unannotated relation a sentence naming both entities: `data_gen.write_examples`, "Evidence"), as the paper
    builds them; False also gives a triple to every later sentence that names one entity with the other in reach."""
    write_counterfactual: int = 0
    """Counterfactual variants of the training documents added to the memory-write training examples (paper
    §4.1, `data_gen.counterfactual`): in each variant every entity is renamed, in all its full mentions, as another
    entity of its type from the training documents, relations kept, so the model must copy names from the text
    rather than recall them. The memory-read examples are built from the documents as they are. 0: none."""
    read_context_free: int = 0
    """Extra memory-read training examples per training document: the reads of one later sentence with the text
    before it dropped (`data_gen.read_examples.context_free_records`). Without them every read follows a
    document's opening, and from a lone sentence start (a Table 3 cloze) the model asks a biography's opening
    relations instead of the one the sentence states."""
    keep_freed_memory: bool = True
    """Keep freed host memory for reuse within each stage (`memllm_jax.train.host_memory`: faster steps); False for
    a config whose steps change shape enough to fragment the kept heap past the host's memory."""
    write_question_form: int = 0
    """Extra memory-write training examples per training document: one of its triples asked as a question with the
    answer after `protocol.WRITE_BRIDGE`, the form of Table 3's ZsRE edits (`data_gen.write_examples.
    question_form_items`). Not in the paper's training data; for a base that, without them, writes the question's
    subject with an object of its own instead of the edit's answer."""
    read_question_form: int = 0
    """Extra memory-read training examples per training document: one of its triples asked as a question, the read
    of its subject and relation, the memory's answer and the object (`data_gen.read_examples.
    question_form_records`). Not in the paper's training data; Table 3 forces a read after each ZsRE question."""
    read_misread_rate: float = 0.0
    """Share of the memory-read training examples' query results replaced by another entity the text named before
    the read (`data_gen.read_examples.misread`): the paper answers training reads from the imperfect memory its
    memory-write model wrote, so the read model learns that a result may be wrong; 0 answers every read from the
    gold triples."""
    vocab_size: int = 4096
    """Tokenizer vocabulary (byte-level BPE trained on the training documents). 4096 makes most of the synthetic
    world's name words single tokens, which the memory-write / memory-read models must copy."""
    tokenizer_texts: tuple[str, ...] = ("lm", "write", "read")
    """Training example files (data/train/<kind>.jsonl) whose text trains the tokenizer: with the API examples
    included, relation names and `>>` get their own tokens."""
    base_model: str = ""
    """An HF model directory (e.g. Mistral-7B converted weights) used as the base instead of pretraining;
    "" = pretrain the tiny base here."""
    pretrain_config: str = "pretrain_tiny"
    """experiments/configs module whose get_config() gives the base model's TrainConfig."""
    mw_config: str = "mw_tiny"
    """experiments/configs module for the memory-write adapter's TrainConfig."""
    mr_config: str = "mr_tiny"
    """experiments/configs module for the memory-read adapter's TrainConfig."""
    train_overrides: tuple[str, ...] = ()
    """`section.field=value` for the training configs, e.g. ("pretrain.steps=200", "mr.lr=1e-3")."""
    matmul_dtype: str | None = None
    """Operand dtype of the linear layers' matmuls of every model of the run, trained or evaluated (`ModelConfig.
    matmul_dtype`; None: each config's own). "bfloat16" multiplies bf16-rounded operands with float32
    accumulation: TPU's default precision, faster than float32 on CPUs that multiply bf16 in hardware (AMX,
    `avx512_bf16`) and slower on CPUs without.
    "auto": whichever is faster on this host (`model.matmul.fast_operand_dtype`), resolved when the pipeline
    starts, so stage keys and `config.json` hold the dtype that ran."""
    encoder: str = "minilm"
    """Name encoder of every memory."""
    write_late_stopping: bool = True
    """Memory writes (the memory stage and the edits) decode with late stopping (paper Appendix A); False: the
    call ends at the first `})` the model emits."""
    write_ban_repeats: int = 0
    """> 0: a memory-write call never writes an item twice; when the model would, the call rewinds to that item's
    start and takes its next choice there instead, at most this many times per call (`decode.item_bans`)."""
    write_max_new_tokens: int = 128
    """Token budget of one memory-write call; a call cut by it keeps its items closed by `;`. Re-DocRED sentences
    need more (31% of their gold calls are longer than 128 SmolLM2 tokens, 17% longer than 192)."""
    write_batch: int = 16
    """Sentences decoded together by the memory stage."""
    write_refill: bool = True
    """The memory stage decodes its sentences in a pool of `write_batch` rows that takes the next sentences as its
    rows finish (`decode.refill`), instead of consecutive batches that each run until their longest call ends. The
    trained SmolLM2 memory-write adapter on 10 Re-DocRED documents (73 sentences, pool 32), idle: 1.29x cold and
    1.37x compiled (115 s against 157 s; docs/decode.md, "Refilling"). The calls are the same up to the rounding of a
    prompt's prefill in a batch of another shape, which can flip a near-tie of the greedy choice (345 triples
    against 336 there)."""
    write_grounded: bool = False
    """The memory stage keeps only grounded triples (`decode.corpus_writer.is_grounded`: both names copied from the
    document, one of them from the focus sentence, a known relation type); the report gives precision / recall
    before and after the check."""
    write_min_confidence: float | str | None = None
    """The memory stage keeps only the triples the memory-write model wrote with at least this confidence: the
    log-probability of the least likely token of the item (`decode.writer.item_confidences`); None keeps all.
    Applied after the grounding check. `"development"`: the threshold among `write_confidence_grid` with the
    highest F1 on the outside documents (a development set: they are written first, then kept at the chosen
    threshold without decoding again); `results/memory.json` records the choice and every candidate's figures."""
    write_confidence_grid: tuple[float, ...] = (-1.0, -0.9, -0.8, -0.7, -0.6, -0.5, -0.4, -0.3)
    """The thresholds `write_min_confidence="development"` chooses from."""
    diagnostic_examples: int = 64
    """Held-out write and read examples on which the adapters' field-split losses (the copy probe) are measured."""
    rows: tuple[str, ...] = ("baseline1", "baseline2", "row3", "row4", "row5", "row6", "row7", "row8", "row9")
    """Table 2 rows to evaluate (memllm_jax.eval.rows.ROWS keys)."""
    read_threshold: float | None = None
    """Rows with model-chosen read positions: read where p(`({MEM_READ(`) >= this (None: where it is the most
    likely token, the paper's greedy decoding)."""
    eval_batch: int = 8
    """Documents per forward in the perplexity evaluation."""
    editing: str = "synthetic"
    """"synthetic" (edits of facts no training document states: `stages._synthetic_edit_records`), a ZsRE JSON
    path, or "" to skip."""
    n_edits: int = 16
    """Edits (records) evaluated."""
    editing_regimes: tuple[str, ...] = ("sequential", "single")
    """"sequential" (all edits written, then asked) and/or "single" (T = 1)."""
    editing_write_checks: bool = False
    """Write the edits with the memory stage's grounding and confidence checks. Off by default: on the embedded
    default (confidence >= -0.6) they left 13 more of the 200 edits without any triple; REL / GEN fell from 0.79 /
    0.82 to 0.71 / 0.76 with single edits and from 0.67 / 0.68 to 0.63 / 0.66 after 200 sequential edits."""
    editing_max_new_tokens: int = 48
    """Tokens generated per editing question: the forced read's query (a two-part query with its inverse takes
    about 30), its answer and the answer text. 24 cut off 7 of the 60 failed sequential REL questions of the
    embedded default before their query closed. Same seed-0 adapters, 2026-11-23, REL / GEN / LOC: 24 tokens
    sequential 0.68 / 0.68 / 1.00, single 0.83 / 0.85 / 1.00; 48 tokens 0.70 / 0.69 / 1.00 and 0.865 / 0.88 / 1.00
    (the editing stage about twice as long)."""
    editing_memory: str = "editing"
    """Retrieval thresholds of the edited memory: "editing" (paper Appendix D: tau_e 0.85, tau_t 0.2, tau_r 0.6,
    chosen for ZsRE questions whose relation words differ from the stored labels), "editing_exact" (the same,
    but a query whose subject and relation names are stored exactly gets only those exact triples:
    `MemoryConfig.exact_match_priority`) or "lm" (Table 2's: tau_e = tau_t = 0.7, tau_r = 0.85)."""
    scaling_sizes: tuple[int, ...] = (0, 100, 1000, 5000)
    """Distractor triples added to the gold evaluation memory for the scaling curve (empty = skip)."""
    scaling_row: str = "row7"
    """Which row's read setting the scaling curve uses."""
    growth_checkpoints: tuple[int, ...] = (100, 300, 1000, 3000, 10000, 30000)
    """Triples added when measuring Figure 4's records-per-triple ratio."""
    parallel_adapters: bool = True
    """Train the memory-read adapter in a second process while the memory-write adapter trains (both start from
    the base; experiments/side_stage.py). Faster on a multi-core CPU; set False on an accelerator host, where
    two processes would compete for the device."""


def _hash(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


_DEPENDS = {
    "corpus": ("corpus", "eval_corpus", "synth_docs", "synth_seed", "heldout_world", "labels", "eval_docs",
               "outside_docs", "train_docs", "write_context_free", "write_evidence", "write_counterfactual",
               "read_context_free", "write_question_form", "read_question_form", "read_misread_rate"),
    "tokenizer": ("base_model", "vocab_size", "tokenizer_texts"),
    "pretrain": ("pretrain_config",),
    "mw": ("mw_config",),
    "mr": ("mr_config",),
    "memory": ("encoder", "write_late_stopping", "write_ban_repeats", "write_max_new_tokens",
               "write_batch", "write_refill",
               "write_grounded", "write_min_confidence", "write_confidence_grid"),
    "diagnostics": ("diagnostic_examples",),
    "table2": ("rows", "read_threshold", "eval_batch"),
    "editing": ("editing", "n_edits", "editing_regimes", "editing_memory", "editing_write_checks",
                "editing_max_new_tokens"),
    "scaling": ("scaling_sizes", "scaling_row", "growth_checkpoints"),
    "report": (),
}
"""Each stage's own settings. The training stages' keys also hold their resolved training config (the module's
contents with the pipeline's `train_overrides` for that section applied)."""

_INPUTS = {
    "corpus": (),
    "tokenizer": ("corpus",),
    "pretrain": ("tokenizer",),
    "mw": ("pretrain",),
    "mr": ("pretrain",),
    "memory": ("mw",),  # the memory-write model writes; the encoder is a memory setting
    "diagnostics": ("mw", "mr", "memory"),
    "table2": ("mr", "memory"),
    "editing": ("mw", "mr", "memory"),  # the edits are written with the memory stage's encoder and budget
    "scaling": ("mr", "memory"),
    "report": ("diagnostics", "table2", "editing", "scaling"),
}
"""The stages whose outputs a stage reads. A stage reruns when its own settings or those of any stage upstream
of it change, and only then: e.g. more memory-read training steps rerun `mr` and the evaluations, not `memory`."""


def _upstream(name: str) -> list[str]:
    """`name` and every stage it reads from, directly or not, in pipeline order."""
    seen, todo = set(), [name]
    while todo:
        stage = todo.pop()
        if stage not in seen:
            seen.add(stage)
            todo.extend(_INPUTS[stage])
    return [s for s in STAGES if s in seen]


def resolve_host_settings(cfg: PipelineConfig, say: Callable[[str], None] = print) -> PipelineConfig:
    """`cfg` with "auto" settings replaced by what this host runs fastest."""
    from memllm_jax.model.matmul import AUTO, fast_operand_dtype

    if cfg.matmul_dtype != AUTO:
        return cfg
    dtype = fast_operand_dtype()
    say(f"matmul_dtype auto -> {dtype} on this host")
    return dataclasses.replace(cfg, matmul_dtype=dtype)


def train_overrides(cfg: PipelineConfig) -> tuple[str, ...]:
    """The training configs' overrides: `cfg.train_overrides`, then `cfg.matmul_dtype` for every section."""
    if cfg.matmul_dtype is None:
        return cfg.train_overrides
    return cfg.train_overrides + tuple(f"{s}.model.matmul_dtype={cfg.matmul_dtype}" for s in ("pretrain", "mw", "mr"))


_TRAINING_STAGES = ("tokenizer", "pretrain", "mw", "mr")
_EVAL_SPLIT_FIELDS = ("eval_corpus", "eval_docs", "outside_docs")
"""Once `eval_corpus` names a separate file, these settings choose only the evaluation and outside documents
(every document of `corpus` trains), so the training stages do not depend on them: evaluating the same adapters
on another file reruns the corpus split and the evaluations, not the training."""


_ADDED_SETTING_DEFAULTS = {"train_docs": 0, "write_counterfactual": 0}
"""Pipeline settings added after runs had been stamped, with the value that runs exactly as before they existed:
left out of the stage keys at that value, so a finished stage is not redone for a setting it already had."""


def stage_key(cfg: PipelineConfig, name: str) -> str:
    """A stage's key covers its own settings and those of every stage upstream of it (its inputs)."""
    settings = {s: {f: getattr(cfg, f) for f in _DEPENDS[s]
                    if not (f in _ADDED_SETTING_DEFAULTS and getattr(cfg, f) == _ADDED_SETTING_DEFAULTS[f])}
                for s in _upstream(name)}
    if name in _TRAINING_STAGES and cfg.eval_corpus:
        settings["corpus"] = {f: v for f, v in settings["corpus"].items() if f not in _EVAL_SPLIT_FIELDS}
    for stage, module_field in (("pretrain", "pretrain_config"), ("mw", "mw_config"), ("mr", "mr_config")):
        if stage in settings:  # the training config's contents, not just its module name
            settings[stage]["resolved"] = _resolved_train_config(getattr(cfg, module_field), stage, train_overrides(cfg))
    return _hash(settings)


_BOOKKEEPING_FIELDS = ("log_every", "checkpoint_every", "keep_checkpoints", "async_checkpoint", "resume",
                       "compilation_cache", "progress", "mesh", "micro_batches", "sparse_head")
"""Training settings that change neither the update a step computes (only how it is laid out over devices and
micro-batches, up to float rounding) nor a file a later stage reads: left out of the stage keys, so checkpointing
more often or splitting a step to fit memory does not redo a finished stage, and an interrupted one resumes
under them (`TrainConfig.RUN_FIELDS`)."""


_ADDED_FIELD_DEFAULTS = {"lora_b_lr_ratio": 1.0}
"""Training settings added after runs had been stamped, with the value that trains exactly as before they existed:
left out of the stage keys at that value, so a finished stage is not redone for a setting it already had."""


def _resolved_train_config(module: str, section: str, overrides: tuple[str, ...]) -> Any:
    """A training config with the pipeline's own paths blanked, so editing e.g. `steps` in the module reruns it."""
    from experiments.training import train_config

    resolved = dataclasses.asdict(train_config(module, section, overrides, train_data="", tokenizer="", workdir="",
                                                init=None))
    return {k: v for k, v in resolved.items()
            if k not in _BOOKKEEPING_FIELDS and not (k in _ADDED_FIELD_DEFAULTS and v == _ADDED_FIELD_DEFAULTS[k])}
