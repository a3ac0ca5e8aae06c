"""Benchmark measurement hygiene: the host-load gate and line, and the matmul ceiling (no timed assertions)."""

from __future__ import annotations

import datetime
import sys
import types

import pytest

from memllm_jax.bench import ceiling, host
from memllm_jax.cli import main


def _sample(load1: float, busy: float, cores: int = 2, steal: float = 0.003) -> host.HostSample:
    return host.HostSample(datetime.datetime(2030, 1, 2, 3, 4, tzinfo=datetime.timezone.utc), (load1, 0.5, 0.25),
                           host.CpuShare(busy, steal), host.CpuTimes(0, 0, 0, 0.0), cores)


@pytest.fixture
def fake_bench(monkeypatch):
    """A `memllm bench fake` whose main records that it ran; the host sampler is replaced by the test."""
    ran = []
    module = types.ModuleType("fake_bench")
    module.__doc__ = "a fake benchmark"
    module.add_arguments = lambda parser: parser.add_argument("--n", type=int, default=1)

    def fake_main(args):
        ran.append(args.n)
        print("| fake | table |")
        return 0

    module.main = fake_main
    monkeypatch.setitem(sys.modules, "fake_bench", module)
    from memllm_jax.bench import cli as bench_cli

    monkeypatch.setitem(bench_cli.BENCHES, "fake", "fake_bench")
    return ran


def _with_host(monkeypatch, before: host.HostSample, after: host.HostSample | None = None):
    monkeypatch.setattr(host, "sample", lambda seconds=1.0, since=None: before if since is None else (after or before))


@pytest.mark.parametrize("load1, busy, steal", [(1.5, 0.0, 0.0), (0.0, 0.6, 0.0), (0.0, 0.0, 0.2)],
                         ids=["load-average", "busy-fraction", "steal"])
def test_bench_refuses_a_busy_host(monkeypatch, capsys, fake_bench, load1, busy, steal):
    _with_host(monkeypatch, _sample(load1, busy, steal=steal))
    assert main(["bench", "fake", "--n", "3"]) == 2
    err = capsys.readouterr().err
    assert "WARNING: the host is busy" in err and "--allow-load" in err
    assert fake_bench == []


def test_bench_runs_under_load_with_allow_load_and_prints_the_load(monkeypatch, capsys, fake_bench):
    _with_host(monkeypatch, _sample(1.5, 0.6), _sample(1.92, 0.1))
    assert main(["bench", "fake", "--allow-load", "--n", "3"]) == 0
    out, err = capsys.readouterr()
    assert fake_bench == [3] and "WARNING: the host is busy" in err
    table, line = out.index("| fake | table |"), out.index("host: 2030-01-02 03:04 UTC, 2 cores")
    assert table < line  # under the table
    assert "load 1/5/15 min 1.50/0.50/0.25 → 1.92/0.50/0.25" in out
    assert "before (1 s sample): others busy 60%, steal 0.3%" in out and "during the run: others busy 10%" in out


@pytest.mark.parametrize("busy, steal, reason", [(0.5, 0.0, "other processes kept 50%"),
                                                  (0.0, 0.257, "the hypervisor stole 25.7%")])
def test_bench_warns_when_the_run_was_disturbed(monkeypatch, capsys, fake_bench, busy, steal, reason):
    """Idle before, but others or the hypervisor took the CPU during the run: the figures are printed with a
    loud warning under them."""
    _with_host(monkeypatch, _sample(0.05, 0.0), _sample(1.2, busy, steal=steal))
    assert main(["bench", "fake"]) == 0
    out, err = capsys.readouterr()
    assert fake_bench == [1] and "| fake | table |" in out
    assert "WARNING: the run was disturbed" in err and reason in err and "not idle-host figures" in err


def test_bench_runs_on_an_idle_host_without_warning(monkeypatch, capsys, fake_bench):
    _with_host(monkeypatch, _sample(0.2, 0.05))
    assert main(["bench", "fake"]) == 0
    out, err = capsys.readouterr()
    assert fake_bench == [1] and "WARNING" not in err and "host: 2030-01-02" in out


def test_cpu_share_from_proc_stat(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 1 2 3\n")
    a = host.read_cpu_times(str(stat))
    stat.write_text("cpu  160 0 70 880 60 0 0 30 0 0\n")
    b = host.read_cpu_times(str(stat))
    b = host.CpuTimes(b.busy, b.steal, b.total, a.own_seconds)  # this process used no CPU in between
    share = host.cpu_share(a, b)
    assert share.busy == pytest.approx(80 / 200) and share.steal == pytest.approx(30 / 200)
    assert host.read_cpu_times(str(tmp_path / "absent")) is None and host.cpu_share(None, b) is None
    line = host.host_line(_sample(0.1, 0.0), host.HostSample(_sample(0, 0).when, None, None, None, 2))
    assert "during the run: n/a (no /proc/stat)" in line and "→ n/a" in line


def test_ceiling_is_the_max_over_frameworks_dtypes_and_sizes(monkeypatch):
    seconds = {("jax", "float32", 512): 0.010, ("jax", "float32", 1024): 0.050, ("torch", "float32", 512): 0.004,
               ("torch", "float32", 1024): 0.080, ("jax", "bfloat16", 512): 0.006, ("jax", "bfloat16", 1024): 0.020,
               ("torch", "bfloat16", 512): 0.030, ("torch", "bfloat16", 1024): 0.040}
    monkeypatch.setattr(ceiling, "matmul_fn", lambda fw, dt, n: (fw, dt, n))
    monkeypatch.setattr(ceiling, "best_seconds", lambda fn, repeats: seconds[fn])
    c = ceiling.measure(("float32", "bfloat16"), (512, 1024))
    assert len(c.measurements) == 8
    flops = {k: 2 * k[2] ** 3 / s for k, s in seconds.items()}
    assert c.flops == max(flops.values()) and (c.best.framework, c.best.dtype, c.best.n) == ("jax", "bfloat16", 1024)
    assert "jax bfloat16 1024^3" in c.describe()


def test_ceiling_best_seconds_is_the_minimum(monkeypatch):
    times = iter([0.0, 5.0, 10.0, 12.0, 20.0, 21.0])  # three repeats: 5 s, 2 s, 1 s
    monkeypatch.setattr(ceiling.time, "perf_counter", lambda: next(times))
    calls = []
    assert ceiling.best_seconds(lambda: calls.append(1), 3) == 1.0 and len(calls) == 4  # + one warm-up call


def test_ceiling_skips_a_missing_framework(monkeypatch):
    monkeypatch.setattr(ceiling, "matmul_fn", lambda fw, dt, n: None if fw == "torch" else fw)
    monkeypatch.setattr(ceiling, "best_seconds", lambda fn, repeats: 1.0)
    assert {m.framework for m in ceiling.measure(sizes=(64,)).measurements} == {"jax"}


def test_interleaved_rotates_the_order_of_contenders():
    """Each round starts one contender later, so no contender always runs right after the same other one."""
    from memllm_jax.bench.timing import interleaved

    calls = []
    t = interleaved({k: (lambda k=k: calls.append(k)) for k in "ABC"}, repeats=4, warmup=1)
    assert calls == list("ABC" + "ABC" + "BCA" + "CAB" + "ABC")
    assert all(len(t[k].seconds) == 4 for k in "ABC")


def test_samples_line_lists_each_contenders_times_in_order():
    from memllm_jax.bench.timing import Timing, samples_line

    line = samples_line({"ours": Timing("ours", [2.7, 1.9]), "peer": Timing("peer", [3.0, 3.01])})
    assert line == "ours: 2700 1900; peer: 3000 3010"
