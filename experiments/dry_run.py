"""`memllm run --dry-run`: check a configuration against its inputs and size its work before any machine time.

Every file a setting names is opened and checked (one line per missing or malformed file), the base model's own
architecture is compared with the adapters' model settings, the stages are listed with their work (documents,
examples, tokens to train, calls to write, rows to score, edits) and each training stage's train step is compiled
ahead of time on the adapters' mesh (fake host devices when the machine has fewer) for XLA's per-device memory.
Nothing is trained, written or loaded beyond the configs and the documents.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
from typing import Callable

from data_gen.docred import documents_from_raw
from data_gen.synthetic import synthetic_rel_info
from experiments.pipeline_config import PipelineConfig, missing_files
from memllm_jax import protocol
from memllm_jax.config import LoraConfig, ModelConfig
from memllm_jax.errors import InputError, load_json
from memllm_jax.model.hf import config_from_hf

ARCHITECTURE = ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "sliding_window",
                "rope_theta", "tie_embeddings")
"""The `ModelConfig` fields that must agree with the base model's own config."""


def _documents(path: str, labels: dict, problems: list[str]) -> list:
    try:
        raw = load_json(path)
        if not isinstance(raw, list):
            raise InputError(f"{path}: expected a JSON array of DocRED-format documents")
        return list(documents_from_raw(raw, labels, path))
    except InputError as exc:
        problems.append(str(exc))
        return []


def _labels(cfg: PipelineConfig, problems: list[str]) -> dict:
    if cfg.data.corpus == "synthetic":
        return synthetic_rel_info(cfg.data.phrase_relations)
    from data_gen.cli import labels_for

    try:
        return labels_for(cfg.data.labels or None, cfg.data.corpus)
    except InputError as exc:
        problems.append(str(exc))
        return {}


def base_architecture(path: str) -> ModelConfig | None:
    """The architecture the base's weights were trained with (its HF config.json, or the GGUF's metadata); None when
    the base is pretrained here."""
    if not path:
        return None
    from memllm_jax.model.gguf import is_gguf, open_gguf, hf_config, packaged_gguf

    p = pathlib.Path(path)
    if path == "smollm2-135m" or is_gguf(p):
        reader = open_gguf(packaged_gguf(path) if path == "smollm2-135m" else p)
        return config_from_hf(hf_config(reader), where=str(p))
    config = p / "config.json"
    if not config.is_file():
        raise InputError(f"{path}: no config.json (setting base.model: an HF model directory, a .gguf file or "
                         "smollm2-135m)")
    return config_from_hf(load_json(config), where=str(config))


def check_inputs(cfg: PipelineConfig) -> tuple[dict, list[str]]:
    """Open every input: `({split: documents}, problems)`, one line per missing or malformed file or setting."""
    problems = missing_files(cfg)
    if problems:
        return {}, problems
    labels = _labels(cfg, problems)
    docs: dict[str, list] = {}
    if cfg.data.corpus == "synthetic":
        docs["corpus"] = []
    else:
        for name in ("corpus", "eval_corpus", "dev_corpus"):
            path = getattr(cfg.data, name)
            if path:
                docs[name] = _documents(path, labels, problems)
        held = docs.get("eval_corpus") if cfg.data.eval_corpus else docs.get("corpus", [])
        need = cfg.data.eval_docs + cfg.data.outside_docs
        if held is not None and len(held) < need + (0 if cfg.data.eval_corpus else 1):
            problems.append(f"{cfg.data.eval_corpus or cfg.data.corpus}: {len(held)} documents, too few for "
                            f"data.eval_docs + data.outside_docs = {need}")
    try:
        base = base_architecture(cfg.base.model)
    except (InputError, OSError) as exc:
        problems.append(str(exc))
        base = None
    if base is not None:
        for part in ("mw", "mr"):
            model = getattr(cfg, part).model
            for field in ARCHITECTURE:
                ours, theirs = getattr(model, field), getattr(base, field)
                if field == "sliding_window" and (ours is None or theirs is None):
                    continue  # a window the base does not use is not an architecture difference
                if ours != theirs:
                    problems.append(f"setting {part}.model.{field}={ours!r}: the base {cfg.base.model} has {theirs!r}")
    if cfg.editing.records not in ("", "synthetic"):
        from memllm_jax.eval.editing import load_zsre

        try:
            records = load_zsre(cfg.editing.records)
            if len(records) < cfg.editing.n_edits:
                problems.append(f"{cfg.editing.records}: {len(records)} usable records, fewer than "
                                f"editing.n_edits = {cfg.editing.n_edits}")
        except InputError as exc:
            problems.append(str(exc))
    return docs, problems


def work(cfg: PipelineConfig, docs: dict) -> list[tuple[str, str]]:
    """Each stage with the work it will do, as `(stage, description)`."""
    if cfg.data.corpus == "synthetic":
        n_train = (cfg.data.train_docs or cfg.data.synth_docs - cfg.data.eval_docs - cfg.data.outside_docs)
        held_sentences = "?"
        train_sentences = None
    else:
        corpus = docs.get("corpus", [])
        train = corpus if cfg.data.eval_corpus else corpus[: max(0, len(corpus) - cfg.data.eval_docs - cfg.data.outside_docs)]
        train = train[: cfg.data.train_docs] if cfg.data.train_docs else train
        held_docs = (docs.get("eval_corpus") or corpus)[-(cfg.data.eval_docs + cfg.data.outside_docs):]
        n_train, train_sentences = len(train), sum(len(d.sentences) for d in train)
        held_sentences = sum(len(d.sentences) for d in held_docs)
    out = [("corpus", f"{n_train} training, {cfg.data.outside_docs} outside, {cfg.data.eval_docs} evaluation documents"
                      + (f"; {len(docs['dev_corpus'])} development documents" if docs.get("dev_corpus") else ""))]
    out.append(("tokenizer", f"the base's ({cfg.base.model})" if cfg.base.model else
                f"BPE of {cfg.tokenizer.vocab_size} tokens trained on the training examples"))
    for part, train_cfg, examples in (("pretrain", cfg.base.pretrain, n_train), ("mw", cfg.mw, train_sentences),
                                      ("mr", cfg.mr, n_train)):
        if part == "pretrain" and cfg.base.model:
            out.append(("pretrain", "none (a pretrained base)"))
            continue
        if train_cfg.steps is not None:
            steps = str(train_cfg.steps)
        elif examples:
            steps = f"~{math.ceil(train_cfg.epochs * examples / train_cfg.global_batch)} ({train_cfg.epochs:g} epochs of ~{examples} examples)"
        else:
            steps = f"{train_cfg.epochs:g} epochs"
        tokens = (f"<= {train_cfg.steps * train_cfg.global_batch * train_cfg.seq_len:,} tokens"
                  if train_cfg.steps is not None else f"<= {train_cfg.global_batch * train_cfg.seq_len:,} tokens a step")
        out.append((part, f"{steps} steps of {train_cfg.global_batch} rows x {train_cfg.seq_len} tokens ({tokens})"))
    out.append(("memory", f"memory-write calls for the {cfg.data.outside_docs + cfg.data.eval_docs} outside and "
                          f"evaluation documents ({held_sentences} sentences), {cfg.write.batch} at a time, "
                          f"<= {cfg.write.max_new_tokens} tokens each"))
    out.append(("diagnostics", f"{cfg.diagnostics.examples} held-out write and read examples"))
    out.append(("table2", f"{len(cfg.table2.rows)} rows x {cfg.data.eval_docs} documents"))
    out.append(("editing", "none" if not cfg.editing.records else
                f"{cfg.editing.n_edits} edits ({cfg.editing.records}), regimes {', '.join(cfg.editing.regimes)}"
                + (f"; <= {cfg.editing.n_edits} phrase-relation edits each of held-out and seen relations, sequential"
                   if cfg.data.phrase_relations and cfg.editing.records == "synthetic" else "")))
    out.append(("scaling", f"{len(cfg.scaling.sizes)} memory sizes x {cfg.data.eval_docs} documents, "
                           f"{len(cfg.scaling.growth_checkpoints)} growth checkpoints"))
    out.append(("two_hop", "none" if not cfg.two_hop.questions else
                f"{cfg.two_hop.questions} two-hop questions over the evaluation documents' facts, 3 conditions, "
                f"<= {cfg.two_hop.max_new_tokens} tokens each" + (", reads kept" if cfg.data.read.keep_reads else "")))
    return out


def plan_training(cfg: PipelineConfig, say: Callable[[str], None]) -> None:
    """Compile each adapter's train step ahead of time on its mesh and print XLA's per-device memory."""
    from memllm_jax.plan_cli import CHIPS_GIB, GIB, _devices, fits, plan_train
    from memllm_jax.sharding import make_mesh

    plans: dict = {}  # adapters with the same shapes share one compile
    for part in ("mw", "mr"):
        train = getattr(cfg, part)
        markers = len(protocol.MARKERS) if train.train_markers else 0
        model = dataclasses.replace(train.model, vocab_size=train.model.vocab_size + markers,
                                    max_seq_len=max(train.model.max_seq_len, train.seq_len))
        lora = dataclasses.replace(train.lora or LoraConfig(), trainable_tokens=tuple(
            range(train.model.vocab_size, train.model.vocab_size + markers)))
        n = len(_devices(1 << 30)) if any(s == -1 for s in (train.mesh.data, train.mesh.fsdp, train.mesh.tensor)) else \
            math.prod((train.mesh.data, train.mesh.fsdp, train.mesh.tensor))
        mesh = make_mesh(train.mesh, _devices(n))
        rows = train.global_batch - train.global_batch % (mesh.shape["data"] * mesh.shape["fsdp"] * train.micro_batches)
        key = (model, lora, train.mesh, rows, train.seq_len, train.micro_batches)
        if key not in plans:
            plans[key] = plan_train(model, lora, mesh, rows, train.seq_len, train.micro_batches)
        plan = plans[key]
        ok = fits(plan)
        say(f"  {part}: train step on mesh {dict(mesh.shape)} ({mesh.devices.flat[0].platform} devices), "
            f"{rows} rows x {train.seq_len} tokens in {train.micro_batches} micro-batch(es): per device args "
            f"{plan.argument_bytes / GIB:.2f} GiB, temp {plan.temp_bytes / GIB:.2f} GiB, peak {plan.peak_bytes / GIB:.2f} "
            f"GiB; fits " + (", ".join(f"{c} {CHIPS_GIB[c]:g}G" for c in ok if ok[c]) or "none of the listed chips")
            + f" (compiled in {plan.compile_s:.1f} s)")


def dry_run(cfg: PipelineConfig, devices: int, say: Callable[[str], None] = print) -> int:
    """Check, size and plan `cfg`; 2 when an input is missing or malformed (each problem said in one line)."""
    docs, problems = check_inputs(cfg)
    for problem in problems:
        print(f"error: {' '.join(problem.split())}", file=sys.stderr)
    if problems:
        return 2
    say(f"{cfg.name}: every input is readable")
    for stage, what in work(cfg, docs):
        say(f"  {stage:12s} {what}")
    say(f"training stages on {devices} devices (ahead-of-time compiled; nothing allocated):")
    plan_training(cfg, say)
    return 0
