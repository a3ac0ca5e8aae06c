"""How far each stage of a run is from what the host allows: its work, its time, and the host's ceilings.

A stage records its work (`Work`) in its stamp (`stages/<name>.json`, under "work"): tokens trained, prefilled and
decoded, model FLOPs by formula (`bench.roofline`: 2P per token and layer, the LM head where logits are taken,
attention per (query, key) pair; a LoRA training step as `bench.train.step_flops` counts it, a full one as 3
forwards), the weight bytes one decode step streams, and the seconds JAX spent compiling (tracing, lowering and
XLA compilation, from `jax.monitoring`). Counts come from what the stages already return or write; a count that
only the decoding or scoring code could give is listed under "not measured".

The host's ceilings (`host_ceilings`): the matmul FLOP/s in the run's dtype (`bench.ceiling`, jax's best of
sizes) and the memory bandwidth (a large-array reduction in jax, best of a few), measured once per host, CPU
flags, jax version and dtype, and kept in `$XDG_CACHE_HOME/memllm_jax/host_ceilings.json`.

A row of the table (`stage_row`): achieved GFLOP/s over the stage's run time (its seconds less compile seconds)
and that as a fraction of the matmul ceiling; for a stage that decodes, the seconds its decode steps need to
stream the weights at the measured bandwidth as a fraction of its run time (a lower bound on how close decoding
came: the run time includes prefill and host work). `results/roofline.json` holds the rows of a run.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import time
from typing import Any, Callable

from experiments.pipeline_config import STAGES
from memllm_jax.bench import ceiling, roofline
from memllm_jax.bench.host import cpu_info, cpu_share, describe, read_cpu_times, share_reasons
from memllm_jax.bench.train import step_flops
from memllm_jax.files import atomic_write_json

COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
"""`jax.monitoring` duration events of a compilation (jax 0.10: `jax._src.dispatch`'s *_EVENT names)."""

CEILING_SIZES = (1024, 2048)
BANDWIDTH_BYTES = 256 << 20
"""The array the bandwidth reduction reads (float32)."""


# ------------------------------------------------------------------------------------------- compile time


class CompileClock:
    """Seconds JAX spends compiling while the context is open (summed `COMPILE_EVENTS`)."""

    def __init__(self):
        self.seconds = 0.0

    def _listen(self, event: str, duration: float, **_: Any) -> None:
        if event in COMPILE_EVENTS:
            self.seconds += duration

    def __enter__(self) -> "CompileClock":
        import jax.monitoring

        jax.monitoring.register_event_duration_secs_listener(self._listen)
        return self

    def __exit__(self, *exc) -> None:
        import jax.monitoring

        jax.monitoring.unregister_event_duration_listener(self._listen)


# ------------------------------------------------------------------------------------------- a stage's work


def weight_bytes(cfg) -> int:
    """Bytes of the weights one decode step reads: the layers' matmuls and the embedding / LM head (norms and LoRA
    factors not counted), in the parameters' dtype."""
    params = cfg.n_layers * roofline.layer_params(cfg) + cfg.d_model * cfg.vocab_size * (1 if cfg.tie_embeddings else 2)
    return params * {"bfloat16": 2, "float16": 2}.get(cfg.param_dtype, 4)


@dataclasses.dataclass
class Work:
    """What a stage computed, counted in plain Python from what it returns (module docstring)."""

    trained_tokens: int = 0
    prefilled_tokens: int = 0
    decoded_tokens: int = 0
    flops: float = 0.0
    weight_bytes_per_step: int = 0
    decode_batch: int = 0
    not_measured: list[str] = dataclasses.field(default_factory=list)

    def training(self, cfg, lora, *, steps: int, batch: int, seq_len: int) -> None:
        """`steps` training steps of `batch` rows x `seq_len` tokens (padding included); a LoRA step as the train
        bench counts it (LM head at every position: an upper bound with a sparse head), a full one as 3 forwards."""
        self.trained_tokens += steps * batch * seq_len
        if lora is not None:
            self.flops += steps * step_flops(cfg, lora.rank, tuple(lora.targets), batch, seq_len)
        else:
            self.flops += steps * 3.0 * roofline.forward_flops(cfg, batch, seq_len)

    def forwards(self, cfg, lengths) -> None:
        """Teacher-forced forwards of sequences of `lengths` tokens, logits at every position."""
        self.prefilled_tokens += int(sum(lengths))
        self.flops += sum(roofline.forward_flops(cfg, 1, int(n)) for n in lengths)

    def writes(self, cfg, prompts, decoded: int, batch: int) -> None:
        """Memory-write calls: `prompts` prefilled (shared prefixes once, `bench.roofline.useful_write_flops`) and
        `decoded` tokens generated in rows of `batch`; a decoded token's attention is counted over its prompt only."""
        self.prefilled_tokens += sum(len(p) for p in prompts)
        self.decoded_tokens += decoded
        if prompts:
            self.flops += roofline.useful_write_flops(cfg, prompts, [0] * len(prompts)).prefill
            mean_prompt = sum(len(p) for p in prompts) / len(prompts)
            self.flops += decoded * (roofline.body_flops(cfg) + roofline.head_flops(cfg))
            self.flops += roofline.attention_flops(cfg, decoded * (mean_prompt + 1))
        self.weight_bytes_per_step = weight_bytes(cfg)
        self.decode_batch = max(self.decode_batch, batch)

    def model_work(self, cfg, w, batch: int) -> None:
        """What a scorer and a greedy generator counted (`eval.scoring.ModelWork`), generated in rows of `batch`."""
        self.prefilled_tokens += w.positions - w.decoded
        self.decoded_tokens += w.decoded
        self.flops += (w.positions * roofline.body_flops(cfg) + w.logits * roofline.head_flops(cfg)
                       + roofline.attention_flops(cfg, w.attention_pairs))
        if w.decoded:
            self.weight_bytes_per_step = weight_bytes(cfg)
            self.decode_batch = max(self.decode_batch, batch)

    def missing(self, what: str) -> None:
        if what not in self.not_measured:
            self.not_measured.append(what)

    def to_json(self, compile_seconds: float) -> dict:
        return {**dataclasses.asdict(self), "compile_seconds": compile_seconds}


# ------------------------------------------------------------------------------------------- host ceilings


def cache_path() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "memllm_jax" / "host_ceilings.json"


def host_key(dtype: str) -> str:
    model, flags = cpu_info()
    return f"{model or 'unknown CPU'} | {' '.join(flags) or 'no recorded flags'} | jax {describe()['jax']} | {dtype}"


def measure_bandwidth(nbytes: int = BANDWIDTH_BYTES, repeats: int = 5) -> float:
    """Bytes/s of a jitted sum over a float32 array of `nbytes` (each element read once), best of `repeats`."""
    import jax
    import jax.numpy as jnp

    x = jnp.ones((nbytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    return nbytes / ceiling.best_seconds(lambda: total(x).block_until_ready(), repeats)


def measure_ceilings(dtype: str) -> dict:
    """The host's matmul ceiling in `dtype` and its memory bandwidth (about 5-20 s). jax only: the run's
    framework, and torch stays out of the run's process (the benches' ceiling also times torch, which can be
    higher)."""
    t0 = time.perf_counter()
    ceil = ceiling.measure((dtype,), CEILING_SIZES, frameworks=("jax",), repeats=3)
    return {"matmul_flops": ceil.flops, "matmul": ceil.describe(), "bandwidth_bytes_per_s": measure_bandwidth(),
            "measured": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "measure_seconds": round(time.perf_counter() - t0, 1)}


def host_ceilings(dtype: str, measure: Callable[[str], dict] | None = None,
                  path: pathlib.Path | None = None) -> dict:
    """This host's ceilings in `dtype`, from the cache file or measured (`measure`, default `measure_ceilings`)
    once and added to it (a cache file that does not parse is measured over). A measurement during which other
    processes kept the CPU busy (`bench.host.share_reasons`) is not cached: it says so under "busy", and the
    next run measures again."""
    measure = measure_ceilings if measure is None else measure
    path = cache_path() if path is None else path
    key = host_key(dtype)
    try:
        cached = json.loads(path.read_text())
    except (OSError, ValueError):
        cached = {}
    if not isinstance(cached, dict):
        cached = {}
    entry = cached.get(key)
    if isinstance(entry, dict) and isinstance(entry.get("matmul_flops"), (int, float)) \
            and isinstance(entry.get("bandwidth_bytes_per_s"), (int, float)):
        return entry
    before = read_cpu_times()
    entry = measure(dtype)
    busy = share_reasons(cpu_share(before, read_cpu_times()))
    if busy:  # a ceiling measured beside other work is this run's only: the next run measures again
        return {**entry, "busy": "; ".join(busy)}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {**cached, key: entry}, indent=1)
    return entry


def needs_ceilings(work: dict | None) -> bool:
    return bool(work and (work.get("flops") or work.get("decoded_tokens")))


# ------------------------------------------------------------------------------------------- the table


def stage_row(name: str, seconds: float | None, work: dict | None, ceilings: dict | None) -> dict:
    """One row of the table (module docstring); fractions are None where there is no work or no ceiling."""
    row: dict[str, Any] = {"stage": name, "seconds": seconds, "recorded": work is not None}
    if work is None or seconds is None:
        return row
    run = max(seconds - work.get("compile_seconds", 0.0), 1e-9)
    flops, decoded = work.get("flops", 0.0), work.get("decoded_tokens", 0)
    row.update({k: work.get(k) for k in ("trained_tokens", "prefilled_tokens", "decoded_tokens", "flops",
                                         "compile_seconds", "decode_batch", "not_measured")})
    row["gflops_per_s"] = flops / run / 1e9 if flops else None
    row["of_ceiling"] = flops / run / ceilings["matmul_flops"] if flops and ceilings else None
    row["of_bandwidth_bound"] = None
    if decoded and ceilings and work.get("decode_batch") and work.get("weight_bytes_per_step"):
        steps = decoded / work["decode_batch"]
        row["of_bandwidth_bound"] = steps * work["weight_bytes_per_step"] / ceilings["bandwidth_bytes_per_s"] / run
    return row


def _tokens(row: dict) -> str:
    parts = [f"{row[k]:,} {label}" for k, label in (("trained_tokens", "trained"), ("prefilled_tokens", "prefilled"),
                                                     ("decoded_tokens", "decoded")) if row.get(k)]
    return ", ".join(parts) or "–"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:.1%}"


def row_line(row: dict) -> str:
    """The one line a stage prints when it ends."""
    if not row.get("recorded"):
        return f"[{row['stage']}] roofline: not recorded"
    if not row.get("flops") and _tokens(row) == "–":
        return f"[{row['stage']}] roofline: no model work counted ({row.get('compile_seconds') or 0:.1f}s compiling)"
    g = row.get("gflops_per_s")
    return (f"[{row['stage']}] roofline: {_tokens(row)}; {(row.get('flops') or 0) / 1e9:,.1f} GFLOP in "
            f"{row['seconds']:.1f}s ({row.get('compile_seconds') or 0:.1f}s compiling); "
            f"{'–' if g is None else f'{g:.2f}'} GFLOP/s = {_pct(row.get('of_ceiling'))} of the matmul ceiling"
            + (f"; decode {_pct(row['of_bandwidth_bound'])} of the bandwidth bound at batch {row['decode_batch']}"
               if row.get("of_bandwidth_bound") is not None else ""))


def run_table(out: str | pathlib.Path, dtype: str, ceilings: Callable[[], dict]) -> dict:
    """`results/roofline.json`'s content: the ceilings (`ceilings()`, called only when a stage has work to hold
    against them) and one row per stamped stage, in the pipeline's order."""
    stamps = {}
    for name in STAGES:
        path = pathlib.Path(out) / "stages" / f"{name}.json"
        if path.exists():
            stamps[name] = json.loads(path.read_text())
    ceil = ceilings() if any(needs_ceilings(s.get("work")) for s in stamps.values()) else None
    return {"dtype": dtype, "ceilings": ceil,
            "rows": [stage_row(name, s.get("seconds"), s.get("work"), ceil) for name, s in stamps.items()]}


def table_markdown(table: dict | None) -> str:
    """The table for report.md, RESULTS.md and index.html; "not recorded" for a run that kept none."""
    title = "**Roofline** — each stage's work against this host's ceilings (`results/roofline.json`)"
    if not table or not table.get("rows"):
        return f"{title}: not recorded"
    c = table.get("ceilings")
    head = (f"ceilings ({table.get('dtype')}): {c['matmul']}; memory bandwidth {c['bandwidth_bytes_per_s'] / 1e9:.1f} "
            "GB/s" if c else "ceilings: not measured")
    if c and c.get("busy"):
        head += f" (measured while the host was busy: {c['busy']})"
    lines = [title, "", head, "",
             "| stage | tokens | GFLOP | seconds | compile s | GFLOP/s | of matmul ceiling | decode: of bandwidth "
             "bound | not measured |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table["rows"]:
        seconds = "–" if r.get("seconds") is None else f"{r['seconds']:.1f}"
        if not r.get("recorded"):
            lines.append(f"| {r['stage']} | not recorded | | {seconds} | | | | | |")
            continue
        g, bw = r.get("gflops_per_s"), r.get("of_bandwidth_bound")
        bound = "–" if bw is None else f"{bw:.1%} (batch {r['decode_batch']})"
        lines.append(f"| {r['stage']} | {_tokens(r)} | {(r.get('flops') or 0) / 1e9:,.1f} | {seconds} | "
                     f"{r.get('compile_seconds') or 0:.1f} | {'–' if g is None else f'{g:.2f}'} | "
                     f"{_pct(r.get('of_ceiling'))} | {bound} | "
                     f"{'; '.join(r.get('not_measured') or []) or '–'} |")
    return "\n".join(lines)
