"""The training run: `run(cfg) -> TrainResult` (also `train(cfg) -> dict` for the pipeline).

Pretraining (mode "full") and LoRA finetuning (mode "lora") share one loop: build the mesh and the model
(random, or the weights of any model path `model.load` opens: an earlier run, an HF directory, a .gguf file),
the grain batch iterator,
the jitted step; resume from the latest checkpoint in `workdir/ckpt` (train state + iterator position);
train with a progress bar, metrics, periodic held-out evaluation and checkpoints, calling the hooks this host
needs and the caller's around each step (`train.hooks`; on a CPU host the runtime's, `memllm_jax.runtime`); stop
with `NonFiniteLoss` (checkpoints written so far are kept) when the loss or gradient norm is NaN/Inf. At the end
the trained model goes to `workdir/model` as a model checkpoint (`memllm_jax.checkpoint`: the full model, or in
LoRA mode the adapter plus a reference to the base it was trained on, with the tokenizer beside it) and the loss
curves to `workdir/loss.png`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections import Counter
from typing import Any, Iterable

import jax
import numpy as np

from memllm_jax import compilation_cache, runtime
from memllm_jax.checkpoint import save_params
from memllm_jax.errors import InputError
from memllm_jax.files import atomic_write_json
from memllm_jax.model.load import base_reference, load
from memllm_jax.model.placement import create_model
from memllm_jax.sharding import make_mesh
from memllm_jax.tokenizer import load_tokenizer
from memllm_jax.train import data as D
from memllm_jax.train import step as S
from memllm_jax.train.checkpoint import Checkpointer
from memllm_jax.train.config import TrainConfig, resume_conflicts, validate
from memllm_jax.train.hooks import HookList
from memllm_jax.train.metrics import MetricsLogger
from memllm_jax.train.optimizer import make_optimizer, schedule
from memllm_jax.train.plots import plot_loss


class NonFiniteLoss(RuntimeError):
    """The loss or the gradient norm became NaN or Inf; the run stopped without saving that state."""


@dataclasses.dataclass
class TrainResult:
    workdir: str
    model_dir: str | None
    """The trained model checkpoint `workdir/model` (`model.load.load` opens it, or the workdir); None when
    stopped early."""
    checkpoint_dir: str
    step: int
    total_steps: int
    train_loss: float | None
    eval_loss: float | None
    eval_perplexity: float | None
    unigram_eval_loss: float | None
    """Cross-entropy of a unigram model of the training tokens on the held-out loss tokens (a baseline)."""
    tokens_per_s: float
    seconds: float
    metrics_path: str
    plot_path: str | None
    stopped_early: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -------------------------------------------------------------------------------------------- helpers


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> None:
    """`jax.distributed.initialize(...)` for multi-process launches, before anything touches the devices.

    With no arguments JAX detects the cluster itself (Cloud TPU pod slices, SLURM, Open MPI, Kubernetes
    jobs); elsewhere (several processes on one machine, a hand-made CPU/GPU cluster) give the coordinator
    `HOST:PORT` (process 0's address; or env `JAX_COORDINATOR_ADDRESS`), the process count and this process's
    id (or env `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID`). Cross-process collectives of the CPU backend use gloo."""
    if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
        num_processes = int(os.environ["JAX_NUM_PROCESSES"])
    if process_id is None and os.environ.get("JAX_PROCESS_ID"):
        process_id = int(os.environ["JAX_PROCESS_ID"])
    if jax.config.jax_cpu_collectives_implementation in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=num_processes, process_id=process_id)


def enable_compilation_cache(cfg: TrainConfig) -> str | None:
    """Point JAX's persistent compilation cache at `cfg.compilation_cache` (`compilation_cache.enable`: a
    subdirectory per kind of host); a relative path is taken relative to the parent of the workdir."""
    if cfg.compilation_cache is None:
        return None
    return compilation_cache.enable(os.path.join(os.path.dirname(os.path.abspath(cfg.workdir)), cfg.compilation_cache))


def initial_model(cfg: TrainConfig, mesh, tok):
    """The model a run starts from, on `mesh`: random, or the weights of `cfg.init_checkpoint` (which must
    agree with `cfg.model`'s architecture; rows appended for the tokenizer's added API markers), with fresh
    adapters in LoRA mode."""
    lora = cfg.lora if cfg.mode == "lora" else None
    if cfg.init_checkpoint:
        return load(cfg.init_checkpoint, tokenizer=tok, config=cfg.model, lora=lora, mesh=mesh, seed=cfg.seed,
                    say=None)[0]
    vocab = getattr(tok, "vocab_size", None)
    if vocab is not None and vocab > cfg.model.vocab_size:
        raise ValueError(f"the tokenizer has {vocab} ids but TrainConfig.model.vocab_size={cfg.model.vocab_size}")
    return create_model(cfg.model, lora, mesh, cfg.seed)


def _abstract(tree):
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None)), tree)


def _unigram_loss(train: D.Corpus, evals: D.Corpus, vocab: int) -> float | None:
    """Add-one-smoothed unigram cross-entropy of the held-out loss tokens."""
    if not evals.examples:
        return None
    counts = Counter()
    for e in train.examples:
        counts.update(e.ids[1:][e.loss[1:]].tolist())
    total = sum(counts.values()) + vocab
    nll, n = 0.0, 0
    for e in evals.examples:
        for t in e.ids[1:][e.loss[1:]].tolist():
            nll -= math.log((counts.get(t, 0) + 1) / total)
            n += 1
    return nll / max(n, 1)


def _check_resumable(workdir: str, cfg: TrainConfig) -> None:
    """Refuse to continue a checkpoint that was trained under other settings (e.g. another learning rate or
    packing): its steps would be mixed into this run's without a word."""
    saved_path = os.path.join(workdir, "train_config.json")
    if not os.path.exists(saved_path):
        return  # a run from before the file was written: nothing to compare
    with open(saved_path) as f:
        conflicts = resume_conflicts(json.load(f), cfg)
    if conflicts:
        raise InputError(f"{workdir}: holds a checkpoint trained with other settings ({'; '.join(conflicts[:3])}"
                         f"{'; ...' if len(conflicts) > 3 else ''}): use another workdir, or set resume=False to "
                         "start over in this one")


# ----------------------------------------------------------------------------------------------- run


def run(cfg: TrainConfig, *, stop_after: int | None = None, hooks: Iterable[Any] = ()) -> TrainResult:
    """Train (or resume) according to `cfg`. `stop_after=k` ends the run after step k as if it were killed
    there (checkpoint written, no final export) - used to test resumption. `hooks` (`train.hooks.TrainHook`)
    are called after those this host needs (`runtime.for_this_host()`: none on an accelerator)."""
    validate(cfg)
    t0 = time.perf_counter()
    workdir = os.path.abspath(cfg.workdir)
    os.makedirs(workdir, exist_ok=True)
    enable_compilation_cache(cfg)
    pidx, pcount = jax.process_index(), jax.process_count()
    mesh = make_mesh(cfg.mesh)
    dp = mesh.shape["data"] * mesh.shape["fsdp"]
    rows = cfg.global_batch // cfg.micro_batches
    if rows % dp or rows % pcount:
        raise ValueError(f"TrainConfig.global_batch/micro_batches={rows} is not divisible by data*fsdp={dp} "
                         f"and the process count {pcount}")

    tok = load_tokenizer(cfg.tokenizer)
    if cfg.mode == "lora" and cfg.train_markers:
        ids = tuple(sorted(set(cfg.lora.trainable_tokens) | set(tok.marker_id.values())))
        cfg = dataclasses.replace(cfg, lora=dataclasses.replace(cfg.lora, trainable_tokens=ids))
    stream = cfg.packing == "pack"  # long documents are cut across rows by the packer, not truncated
    corpus = D.load_corpus(cfg.train_data, tok, cfg.seq_len, truncate=not stream)
    if cfg.eval_data:
        eval_corpus = D.load_corpus(cfg.eval_data, tok, cfg.seq_len, truncate=not stream)
    elif cfg.eval_fraction > 0:
        corpus, eval_corpus = D.split_heldout(corpus, cfg.eval_fraction, cfg.data_seed)
    else:
        eval_corpus = D.Corpus([], 0, 0)
    if stream:  # evaluation rows are padded one example each: windows of seq_len + 1 tokens
        eval_corpus = D.Corpus([w for ex in eval_corpus.examples for w in D.split_long(ex, cfg.seq_len + 1)], 0, 0)
    if cfg.eval_max_examples is not None:
        eval_corpus = D.Corpus(eval_corpus.examples[: cfg.eval_max_examples], 0, 0)
    planner = D.Planner(corpus, seq_len=cfg.seq_len, global_batch=cfg.global_batch, packing=cfg.packing,
                        seed=cfg.data_seed, buckets=cfg.buckets)
    total = cfg.steps if cfg.steps is not None else max(1, math.ceil(cfg.epochs * planner.batches_per_epoch))

    model = initial_model(cfg, mesh, tok)
    split = S.split_model(model, cfg.mode)
    del model
    tx = make_optimizer(cfg, total)
    shardings = S.train_state_shardings(split, tx, mesh)
    state = S.init_train_state(split, tx, shardings)
    train_step = S.make_train_step(split, tx, mesh, shardings, schedule(cfg, total))
    eval_step = S.make_eval_step(split, mesh, shardings)

    ckpt = Checkpointer(os.path.join(workdir, "ckpt"), keep=cfg.keep_checkpoints, async_save=cfg.async_checkpoint)
    head_groups = dp if cfg.sparse_head and dp % pcount == 0 else 0  # one group of rows per batch shard
    head_floors = D.run_head_capacities(planner, total, cfg.micro_batches, head_groups) if head_groups else None
    iterator = D.make_iterator(planner, total, pad_id=tok.pad_id, micro_batches=cfg.micro_batches,
                               process_index=pidx, process_count=pcount, head_groups=head_groups,
                               head_floors=head_floors)
    start = 0
    if cfg.resume and ckpt.latest_step() is not None:
        _check_resumable(workdir, cfg)
        state, data_state = ckpt.restore(_abstract(state))
        start = int(jax.device_get(state.step))
        if data_state:
            iterator.set_state(data_state)
    elif ckpt.latest_step() is not None:
        ckpt.clear()
    if pidx == 0:
        atomic_write_json(os.path.join(workdir, "train_config.json"), dataclasses.asdict(cfg), indent=1)
    n_trained = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state.params))
    logger = MetricsLogger(workdir, total_steps=total, start_step=start, progress=cfg.progress, name=cfg.name)
    logger.write(
        f"{cfg.name}: {cfg.mode} mode, {n_trained:,} trained parameters, {len(corpus.examples)} train / "
        f"{len(eval_corpus.examples)} held-out examples ({corpus.truncated} truncated, {corpus.dropped} dropped), "
        f"{planner.batches_per_epoch} batches/epoch, steps {start}->{total}, mesh {dict(mesh.shape)}"
        + (f", LM head at {', '.join(f'{c:,}' for c in head_floors.values())} loss positions per group of rows"
           if head_floors else "")
    )

    eval_rows = max(dp, (cfg.eval_batch // dp) * dp)

    def evaluate() -> dict[str, float] | None:
        if not eval_corpus.examples:
            return None
        loss_sum = n = 0.0
        for local in D.eval_batches(eval_corpus, seq_len=cfg.seq_len, batch=eval_rows, pad_id=tok.pad_id,
                                    buckets=cfg.buckets, process_index=pidx, process_count=pcount,
                                    head_groups=head_groups):
            local = {k: v[0] for k, v in local.items()}
            s, c = eval_step(state.params, state.rngs, split.frozen, S.to_global(local, mesh, micro=False))
            loss_sum += float(s)
            n += float(c)
        loss = loss_sum / max(n, 1.0)
        return {"loss": loss, "perplexity": math.exp(min(loss, 80.0)), "loss_tokens": n}

    hooks = HookList([*runtime.for_this_host(), *hooks])
    last_metrics: dict[str, float] = {}
    last_eval = None
    stopped = started = False
    done = start
    try:
        if cfg.eval_every and start == 0 and total > 0:
            last_eval = evaluate()
            if last_eval:
                logger.log(0, last_eval, kind="eval")
        hooks.on_start(start, logger.write)
        started = True
        for step in range(start, total):
            local = next(iterator)
            hooks.before_step(step + 1, local)
            state, m = train_step(state, split.frozen, S.to_global(local, mesh))
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            done = step + 1
            if not (math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])):
                ckpt.wait()
                good = ckpt.latest_step()
                raise NonFiniteLoss(
                    f"{cfg.name}: non-finite training loss at step {done} (loss={m['loss']}, grad_norm="
                    f"{m['grad_norm']}); stopped without saving that state. Last good checkpoint: "
                    + (f"step {good} in {ckpt.directory}" if good is not None else "none")
                    + ". Try a lower TrainConfig.lr, more warmup_steps, or clip_norm."
                )
            last_metrics = m
            hooks.on_step(done, m)
            logger.count_tokens(int(local["attn_mask"].sum()) * pcount)
            logger.step(done, m, write=done % cfg.log_every == 0 or done == total)
            if cfg.eval_every and done % cfg.eval_every == 0 and done != total:
                last_eval = evaluate()
                if last_eval:
                    logger.log(done, last_eval, kind="eval")
            if (cfg.checkpoint_every and done % cfg.checkpoint_every == 0) or (stop_after is not None and done >= stop_after):
                ckpt.save(done, state, iterator.get_state())
            if done in cfg.export_steps and done != total:
                export_model(cfg, S.merge(split, params=state.params, rngs=state.rngs), done, workdir)
            if stop_after is not None and done >= stop_after:
                stopped = True
                break
        model_dir = plot_path = None
        if not stopped:
            last_eval = evaluate()
            if last_eval:
                logger.log(total, last_eval, kind="eval")
            if total not in ckpt.all_steps():
                ckpt.save(total, state, iterator.get_state())
            model_dir = export_model(cfg, S.merge(split, params=state.params, rngs=state.rngs), total, workdir)
            if pidx == 0:
                plot_path = plot_loss([logger.path], os.path.join(workdir, "loss.png"), labels=[cfg.name])
        ckpt.wait()
    finally:
        if started:
            hooks.on_end(done)
        logger.close()
        ckpt.close()
    unigram = _unigram_loss(corpus, eval_corpus, getattr(tok, "vocab_size", cfg.model.vocab_size))
    result = TrainResult(
        workdir=workdir, model_dir=model_dir, checkpoint_dir=ckpt.directory, step=int(jax.device_get(state.step)),
        total_steps=total, train_loss=last_metrics.get("loss"), eval_loss=last_eval["loss"] if last_eval else None,
        eval_perplexity=last_eval["perplexity"] if last_eval else None, unigram_eval_loss=unigram,
        tokens_per_s=logger.tokens_per_s, seconds=time.perf_counter() - t0, metrics_path=logger.path,
        plot_path=plot_path, stopped_early=stopped,
    )
    if pidx == 0 and not stopped:
        atomic_write_json(os.path.join(workdir, "result.json"), result.to_dict(), indent=1)
    logger.write(
        f"{cfg.name}: done at step {result.step}/{total} in {result.seconds:.0f}s; train loss {result.train_loss}, "
        f"eval loss {result.eval_loss} (unigram baseline {unigram})"
    )
    return result


def train(cfg: TrainConfig) -> dict[str, Any]:
    """`run(cfg)` as a JSON-able dict (the experiments pipeline's entry point)."""
    return run(cfg).to_dict()


def export_model(cfg: TrainConfig, model, step: int, workdir: str) -> str:
    """Write the trained `model` to `workdir/model` (a model checkpoint with the tokenizer beside it): in LoRA
    mode on top of `init_checkpoint` the adapter and a reference to that base, otherwise every parameter."""
    base = None
    if cfg.mode == "lora" and cfg.init_checkpoint:
        base = base_reference(cfg.init_checkpoint, model.cfg.vocab_size)
    directory = os.path.join(workdir, "model")
    save_params(directory, step, model, base=base, tokenizer=cfg.tokenizer)
    return directory
