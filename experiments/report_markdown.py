"""`memllm report --markdown RUN_DIR... [--out RESULTS.md]`: the project's results page, generated from run
directories (never edited by hand; `make results` writes RESULTS.md from `outputs/*/`).

One section per config (`config.json`'s name); of several run directories of one config the latest wins (the
one whose last stage finished last). A section gives where and how the run ran (the host, the matmul dtype, the
load, from the run's `host.json`), the run's tables (`tables.results_tables`, as in its `results/report.md`, the
roofline table included: "not recorded" for a run older than it) and how long each stage took (its
`stages/<name>.json` stamp). A stage's finishing time is its stamp's modification
time, so copy a run directory with its times kept (`cp -a`).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import pathlib

from experiments.roofline_table import table_markdown
from experiments.tables import results_tables
from memllm_jax.bench.host import RECORDED_FLAGS
from memllm_jax.errors import InputError, load_json
from memllm_jax.files import atomic_write_text


@dataclasses.dataclass(frozen=True)
class Stamp:
    name: str
    seconds: float | None
    finished: datetime.datetime
    skipped: bool


@dataclasses.dataclass(frozen=True)
class RunDir:
    path: pathlib.Path
    config: dict
    host: dict | None
    """`host.json`: the host of the latest `memllm run` in the directory (None where the run did not record it)."""
    stamps: list[Stamp]
    """The stages' stamps in the order they finished."""

    @property
    def name(self) -> str:
        return str(self.config.get("name") or self.path.name)

    @property
    def finished(self) -> datetime.datetime | None:
        return self.stamps[-1].finished if self.stamps else None

    @property
    def matmul_dtype(self) -> str | None:
        """The operand dtype that ran: the host record's (with "auto" resolved), else the config's."""
        return (self.host or {}).get("matmul_dtype", self.config.get("matmul_dtype"))


def _mtime(path: pathlib.Path) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(path.stat().st_mtime, datetime.timezone.utc)


def _json_object(path: pathlib.Path) -> dict:
    obj = load_json(path)
    if not isinstance(obj, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_run(path: str | pathlib.Path) -> RunDir:
    """The run directory `path` (a `memllm run --out` directory: it has `config.json`); InputError otherwise."""
    path = pathlib.Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a run directory (no such directory)")
    if not (path / "config.json").is_file():
        raise InputError(f"{path}: not a run directory (no config.json)")
    config = _json_object(path / "config.json")
    host = _json_object(path / "host.json") if (path / "host.json").is_file() else None
    stamps = []
    for f in (path / "stages").glob("*.json"):
        info = _json_object(f)
        seconds = info.get("seconds")
        stamps.append(Stamp(f.stem, seconds if isinstance(seconds, (int, float)) else None, _mtime(f),
                            bool(info.get("skipped"))))
    return RunDir(path, config, host, sorted(stamps, key=lambda s: (s.finished, s.name)))


def latest_per_config(runs: list[RunDir]) -> list[tuple[RunDir, list[RunDir]]]:
    """`(the latest run, the older ones)` per config, in the order each config first appears in `runs`. A run
    with no finished stage counts as older than any with one; of runs that finished at the same time, the one
    named last wins."""
    by_name: dict[str, list[RunDir]] = {}
    for run in runs:
        by_name.setdefault(run.name, []).append(run)
    out = []
    for group in by_name.values():
        ordered = sorted(group, key=lambda r: r.finished or datetime.datetime.min.replace(tzinfo=datetime.timezone.utc))
        out.append((ordered[-1], ordered[-2::-1]))
    return out


def _host_lines(run: RunDir) -> list[str]:
    host = run.host
    dtype = run.matmul_dtype or "each training config's own"
    if host is None:
        return ["- host: not recorded (the run directory has no host.json)", f"- matmul dtype: {dtype}"]
    flags = " ".join(host.get("flags") or []) or "none of " + " / ".join(RECORDED_FLAGS)
    load = host.get("load")
    return [f"- host: {host.get('cpu') or 'CPU model unknown'}, {host.get('cores')} cores (CPU flags: {flags}); "
            f"jax {host.get('jax') or 'unknown'}",
            f"- matmul dtype: {dtype}",
            "- load average when the run started (1 / 5 / 15 min): "
            + ("not recorded" if not load else " / ".join(f"{x:.2f}" for x in load))
            + f" on {host.get('cores')} cores"]


def stage_times_markdown(stamps: list[Stamp]) -> str:
    """Seconds per stage in the order the stages finished, and their total."""
    lines = ["**Stage times** — a stage that was up to date at a later `memllm run` keeps the time it took when it "
             "ran", "", "| stage | seconds | finished (UTC) |", "|---|---|---|"]
    lines += [f"| {s.name} | {'–' if s.seconds is None else f'{s.seconds:.1f}'}{' (skipped)' if s.skipped else ''} | "
              f"{s.finished:%Y-%m-%d %H:%M} |" for s in stamps]
    total = sum(s.seconds for s in stamps if s.seconds is not None)
    lines.append(f"| total | {total:.1f} ({total / 3600:.2f} h) | |")
    return "\n".join(lines)


def run_section(run: RunDir, older: list[RunDir] = ()) -> str:
    finished = f"{run.finished:%Y-%m-%d %H:%M} UTC" if run.finished else "no stage finished yet"
    others = ", ".join(f"`{r.path}`" for r in older)
    parts = [f"## {run.name}", "", f"- run directory: `{run.path}`"
             + (f" (older runs of this config not shown: {others})" if older else ""),
             f"- last stage finished: {finished}", *_host_lines(run), ""]
    blocks = results_tables(run.path / "results") if (run.path / "results").is_dir() else []
    if run.stamps:
        blocks.append(stage_times_markdown(run.stamps))
        if not (run.path / "results" / "roofline.json").is_file():  # a run older than the table
            blocks.append(table_markdown(None))
    if not blocks:
        blocks = ["No results yet."]
    for block in blocks:
        parts += [block.rstrip("\n"), ""]
    return "\n".join(parts)


def results_markdown(runs: list[RunDir]) -> str:
    """RESULTS.md: a header, then one section per config (its latest run)."""
    parts = ["# MemLLM results", "",
             "Generated by `memllm report --markdown RUN_DIR...` (`make results`) from run directories: the latest run "
             "of each config, its tables as in the run's `results/report.md`. Regenerate it; do not edit it.", ""]
    parts += [run_section(latest, older) for latest, older in latest_per_config(runs)]
    return "\n".join(parts).rstrip("\n") + "\n"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="`memllm run --out` directories")
    parser.add_argument("--markdown", action="store_true",
                        help="markdown, the format of RESULTS.md (the default and only format; each run's HTML page is "
                             "its results/index.html)")
    parser.add_argument("--out", default=None, help="write to this file (atomically) instead of stdout")


def main(args: argparse.Namespace) -> int:
    if args.out is not None and pathlib.Path(args.out).is_dir():
        raise InputError(f"{args.out}: --out is a directory; give a file such as RESULTS.md")
    runs, seen = [], set()
    for path in args.runs:
        run = read_run(path)
        if run.path.resolve() not in seen:
            seen.add(run.path.resolve())
            runs.append(run)
    text = results_markdown(runs)
    if args.out is None:
        print(text, end="")
    else:
        atomic_write_text(args.out, text)
        configs = len(latest_per_config(runs))
        print(f"wrote {args.out}: {configs} config{'s' * (configs != 1)} from {len(runs)} run "
              f"director{'ies' if len(runs) != 1 else 'y'}")
    return 0
