"""How busy the host is, before and during a benchmark: load averages and CPU busy / steal fractions.

The machines are shared, so a figure measured while other processes run is not this code's speed. Every
`memllm bench` samples the host first, refuses to start when it is busy (unless `--allow-load`), and prints
the load before and after under its table, with the date, so a reader can judge the figures; when other
processes or the hypervisor (steal) took a share of the CPU during the run, it says so loudly under the table.

`describe()` is the same host as a JSON-able record (CPU model, cores, the CPU features matmul speed depends on,
load, jax version): `memllm run` keeps it in its run directory (`host.json`) for the results page.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import os
import sys
import time

BUSY_LOAD_PER_CORE = 0.5
"""A 1-minute load average above this times the core count counts as busy."""
BUSY_FRACTION = 0.20
"""A busy fraction of all cores above this, from other processes during a 1 s sample, counts as busy."""
BUSY_STEAL = 0.05
"""A fraction of all cores' time stolen by the hypervisor above this counts as busy: on a shared VM the
torch peers slow down far more than XLA then (at 25.7% steal the torch peer ran at 84 tokens/s against
430-680 idle)."""


@dataclasses.dataclass(frozen=True)
class CpuTimes:
    """Cumulative jiffies of the `cpu` line of /proc/stat, and this process's own CPU seconds at that moment."""

    busy: int
    steal: int
    total: int
    own_seconds: float


@dataclasses.dataclass(frozen=True)
class CpuShare:
    """Fractions of all cores' time over an interval."""

    busy: float
    """Busy (user, nice, system, irq, softirq) in other processes: this process's own CPU time is subtracted."""
    steal: float
    """Stolen by the hypervisor for other guests."""


def read_cpu_times(path: str = "/proc/stat") -> CpuTimes | None:
    """None where /proc/stat does not exist or is unreadable (not Linux, a sandbox)."""
    try:
        with open(path, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    t = os.times()
    return CpuTimes(user + nice + system + irq + softirq, steal, user + nice + system + idle + iowait + irq + softirq + steal,
                    t.user + t.system + t.children_user + t.children_system)


def cpu_share(before: CpuTimes | None, after: CpuTimes | None) -> CpuShare | None:
    if before is None or after is None or after.total <= before.total:
        return None
    total = after.total - before.total
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    own = (after.own_seconds - before.own_seconds) * hz
    return CpuShare(max(0.0, (after.busy - before.busy - own) / total), (after.steal - before.steal) / total)


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except (OSError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class HostSample:
    when: datetime.datetime
    load: tuple[float, float, float] | None
    """1, 5 and 15-minute load averages."""
    share: CpuShare | None
    """Busy / steal over a short sample (before the run) or over the whole run (after it)."""
    cpu: CpuTimes | None
    cores: int

    def busy_reasons(self) -> list[str]:
        reasons = []
        if self.load is not None and self.load[0] > BUSY_LOAD_PER_CORE * self.cores:
            reasons.append(f"1-minute load average {self.load[0]:.2f} > {BUSY_LOAD_PER_CORE} x {self.cores} cores")
        return reasons + share_reasons(self.share)


def share_reasons(share: CpuShare | None) -> list[str]:
    """Why a busy / steal share disturbs a timing (`BUSY_FRACTION`, `BUSY_STEAL`)."""
    reasons = []
    if share is not None and share.busy > BUSY_FRACTION:
        reasons.append(f"other processes kept {share.busy:.0%} of the CPU busy (> {BUSY_FRACTION:.0%})")
    if share is not None and share.steal > BUSY_STEAL:
        reasons.append(f"the hypervisor stole {share.steal:.1%} of the CPU (> {BUSY_STEAL:.0%})")
    return reasons


def sample(seconds: float = 1.0, since: HostSample | None = None) -> HostSample:
    """Load averages now, and busy / steal fractions over `seconds` of sleep (or since an earlier sample)."""
    if since is None:
        start = read_cpu_times()
        time.sleep(seconds)
    else:
        start = since.cpu
    now = read_cpu_times()
    return HostSample(datetime.datetime.now(datetime.timezone.utc), load_average(), cpu_share(start, now), now,
                      os.cpu_count() or 1)


def _load(s: HostSample) -> str:
    return "n/a" if s.load is None else "/".join(f"{x:.2f}" for x in s.load)


def _share(s: CpuShare | None) -> str:
    return "n/a (no /proc/stat)" if s is None else f"others busy {s.busy:.0%}, steal {s.steal:.1%}"


def host_line(before: HostSample, after: HostSample) -> str:
    """`host: <date>, N cores; load 1/5/15 min a → b; before (1 s): ...; during the run: ...`."""
    return (f"host: {before.when:%Y-%m-%d %H:%M} UTC, {before.cores} cores; load 1/5/15 min {_load(before)} → "
            f"{_load(after)}; before (1 s sample): {_share(before.share)}; during the run: {_share(after.share)}")


def warn_if_disturbed(after: HostSample) -> bool:
    """After the run: warn loudly when other processes or the hypervisor took a share of the CPU during it
    (the load average cannot tell: the benchmark itself raises it). True when it warned."""
    reasons = share_reasons(after.share)
    if reasons:
        _shout(f"the run was disturbed: {'; '.join(reasons)}.\nThese are not idle-host figures.")
    return bool(reasons)


def _shout(warning: str) -> None:
    bar = "!" * 78
    print(f"{bar}\nWARNING: {warning}\n{bar}", file=sys.stderr)


def check_idle(before: HostSample, allow_load: bool) -> bool:
    """Warn loudly when the host is busy; True when the benchmark may run."""
    reasons = before.busy_reasons()
    if not reasons:
        return True
    _shout(f"the host is busy: {'; '.join(reasons)}.\nTimings measured now mix in other processes' work.")
    return allow_load


RECORDED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
"""/proc/cpuinfo flags `describe` records: the vector width and the bf16 dot-product instructions
(`model.matmul.BF16_DOT_FLAGS`) that decide how fast the matmuls run and which dtype "auto" picks."""


def cpu_info(cpuinfo: str | None = None) -> tuple[str | None, list[str]]:
    """`(CPU model name, the RECORDED_FLAGS it has)` from /proc/cpuinfo's first processor; `(None, [])` where it
    cannot be read (not Linux, a sandbox)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            return None, []
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    return fields.get("model name"), [f for f in RECORDED_FLAGS if f in flags]


def describe() -> dict:
    """This host now: `{"when", "cpu", "cores", "flags", "load", "jax"}` (load: 1/5/15-minute averages or None;
    jax: the installed version, read without importing it)."""
    model, flags = cpu_info()
    try:
        jax_version = importlib.metadata.version("jax")
    except importlib.metadata.PackageNotFoundError:
        jax_version = None
    load = load_average()
    return {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "cpu": model,
            "cores": os.cpu_count() or 1, "flags": flags, "load": None if load is None else [round(x, 2) for x in load],
            "jax": jax_version}
