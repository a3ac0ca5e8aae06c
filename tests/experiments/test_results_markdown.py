"""`memllm report --markdown RUN_DIR...` (RESULTS.md): one section per config with the run's host, dtype, load,
tables and stage times; the latest run of a config wins; a path that is not a run directory is one line, exit 2.
Also the host record `memllm run` leaves in its directory, and the Table 2 chart's layout."""

import datetime
import json
import os
import re
import shutil

import pytest

from experiments.report_markdown import read_run, results_markdown
from experiments.tables import table2_markdown, table3_markdown
from memllm_jax.cli import main
from tests.eval.test_report_html import make_run

UTC = datetime.timezone.utc
HOST = {"when": "2026-12-01T09:00:00+00:00", "cpu": "Intel(R) Xeon(R) Platinum 8480+", "cores": 2,
        "flags": ["avx512f", "avx512_bf16", "amx_bf16"], "load": [0.5, 0.42, 0.3], "jax": "0.4.38",
        "matmul_dtype": "bfloat16"}
AGREE = {"written_unique": 5, "gold_unique": 10, "correct": 4, "precision": 0.8, "recall": 0.4, "f1": 0.533}


def _stamp(run, name, seconds, when, **info):
    path = run / "stages" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": "k", "seconds": seconds, **info}))
    os.utime(path, (when.timestamp(), when.timestamp()))


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    """A run directory as the pipeline leaves it (`test_report_html.make_run`), made once."""
    return make_run(tmp_path_factory.mktemp("template"))


@pytest.fixture
def fake_run(pipeline_run, tmp_path):
    def make(dirname="a", name="demo", finished=datetime.datetime(2026, 12, 1, 10, 30, tzinfo=UTC), target=9.95,
             host=HOST):
        """A copy of `pipeline_run` in `tmp_path/dirname` with the markdown tables its stages write, the
        memory-write diagnostics, the host record and three stage stamps ending at `finished`."""
        run = tmp_path / dirname
        shutil.copytree(pipeline_run, run)
        res = run / "results"
        (run / "config.json").write_text(json.dumps({"name": name, "matmul_dtype": "float32"}))
        t2 = json.loads((res / "table2.json").read_text())
        t2["row3"]["ppl"]["target"] = target
        (res / "table2.json").write_text(json.dumps(t2))
        (res / "table2.md").write_text(table2_markdown(t2) + "\n")
        (res / "table3.md").write_text(table3_markdown(json.loads((res / "table3.json").read_text())) + "\n")
        (res / "diagnostics.json").write_text(json.dumps({"mw_against_gold": AGREE}))
        if host is not None:
            (run / "host.json").write_text(json.dumps(host))
        _stamp(run, "corpus", 12.5, finished - datetime.timedelta(minutes=30))
        _stamp(run, "table2", 600.0, finished - datetime.timedelta(minutes=10), rows=["baseline1", "row3", "row9"])
        _stamp(run, "scaling", 0.25, finished, skipped=True)
        return run

    return make


def test_a_section_has_the_runs_host_dtype_load_tables_and_stage_times(fake_run, capsys):
    run = fake_run()
    assert main(["report", "--markdown", str(run)]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# MemLLM results\n") and md.count("\n## ") == 1 and "\n## demo\n" in md
    assert f"- run directory: `{run}`\n" in md
    assert "- last stage finished: 2026-12-01 10:30 UTC\n" in md
    assert ("- host: Intel(R) Xeon(R) Platinum 8480+, 2 cores (CPU flags: avx512f avx512_bf16 amx_bf16); "
            "jax 0.4.38\n") in md
    assert "- matmul dtype: bfloat16\n" in md  # the host record's (resolved) dtype, not the config's
    assert "- load average when the run started (1 / 5 / 15 min): 0.50 / 0.42 / 0.30 on 2 cores\n" in md
    # memory-write precision / recall, Table 2 (the baseline and the rows), Table 3, stage times
    assert "| 5 | 10 | 4 | 0.800 | 0.400 | 0.533 |" in md
    assert "| Baseline #1 | base model (no memory) | 51.700 | 301.900 | 115.400 | 0 |" in md
    assert "| ③ | MemLLM, MW[evaluation corpus] | 5.900 | 9.950 | 8.600 | 5 (4) |" in md
    assert "| MemLLM (ours, sequential) | 20 | 0.30 | 0.30 | 0.50 | 0.37 |" in md
    assert "| corpus | 12.5 | 2026-12-01 10:00 |" in md and "| table2 | 600.0 | 2026-12-01 10:20 |" in md
    assert "| scaling | 0.2 (skipped) | 2026-12-01 10:30 |" in md and "| total | 612.8 (0.17 h) | |" in md
    assert md.index("| corpus |") < md.index("| table2 | 600.0") < md.index("| scaling |")
    assert md.index("Memory-write model") < md.index("Table 2 (ours)") < md.index("Table 3") < md.index("Stage times")


def test_the_tables_are_the_runs_report_tables(fake_run):
    """RESULTS.md and the run's report.md are built from one function (`tables.results_tables`)."""
    import types

    from experiments import stages

    run = fake_run()
    pipe = types.SimpleNamespace(out=run, cfg=types.SimpleNamespace(name="demo"), say=lambda msg: None)
    stages.stage_report(pipe)
    report = (run / "results" / "report.md").read_text()
    section = results_markdown([read_run(run)])
    tables = section[section.index("**Memory-write model"):section.index("**Stage times")].strip()
    assert tables and tables in re.sub(r"\n{3,}", "\n\n", report)  # report.md keeps a table file's last newline


def test_two_configs_give_two_sections_and_a_run_without_host_record_says_so(fake_run, tmp_path, capsys):
    a = fake_run("a", name="default")
    b = fake_run("b", name="smollm2_redocred", target=4.25, host=None)
    out = tmp_path / "RESULTS.md"
    assert main(["report", "--markdown", str(a), str(b), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    md = out.read_text()
    assert md.count("\n## ") == 2 and md.index("## default") < md.index("## smollm2_redocred")
    second = md[md.index("## smollm2_redocred"):]
    assert "| 5.900 | 4.250 | 8.600 |" in second and "| 5.900 | 9.950 | 8.600 |" not in second
    assert "- host: not recorded (the run directory has no host.json)" in second
    assert "- matmul dtype: float32" in second  # the config's, without a host record
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_latest_run_of_a_config_wins_whatever_the_order(fake_run):
    old = fake_run("old", finished=datetime.datetime(2026, 11, 1, 8, 0, tzinfo=UTC), target=20.5)
    new = fake_run("new", finished=datetime.datetime(2026, 12, 2, 8, 0, tzinfo=UTC), target=3.75)
    for order in ([old, new], [new, old]):
        md = results_markdown([read_run(p) for p in order])
        assert md.count("\n## demo\n") == 1 and "| 5.900 | 3.750 | 8.600 |" in md and "20.500" not in md
        assert f"- run directory: `{new}` (older runs of this config not shown: `{old}`)" in md
        assert "- last stage finished: 2026-12-02 08:00 UTC" in md


def _not_a_run(tmp, config_text):
    """A directory with `config_text` as its config.json (None: none), or a missing path (config_text "-")."""
    path = tmp / "bad"
    if config_text != "-":
        path.mkdir()
    if config_text not in (None, "-"):
        (path / "config.json").write_text(config_text)
    return path


@pytest.mark.parametrize("config_text, why", [("-", "not a run directory (no such directory)"),
                                              (None, "not a run directory (no config.json)"),
                                              ("[]", "config.json: expected a JSON object, got list"),
                                              ('{"name": ', "config.json: invalid JSON")])
def test_a_path_that_is_not_a_run_directory_is_one_line_and_exit_2(fake_run, config_text, why, tmp_path, capsys):
    good, bad = fake_run(), _not_a_run(tmp_path, config_text)
    out = tmp_path / "RESULTS.md"
    capsys.readouterr()
    assert main(["report", "--markdown", str(good), str(bad), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and str(bad) in captured.err and why in captured.err
    assert captured.out == "" and not out.exists()  # nothing written


def test_an_out_path_that_is_a_directory_is_one_line_and_exit_2(fake_run, tmp_path, capsys):
    run = fake_run()
    assert main(["report", "--markdown", str(run), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path}: --out is a directory; give a file such as RESULTS.md\n"


def test_memllm_run_records_its_host(tmp_path):
    from experiments.pipeline import Pipeline
    from experiments.pipeline_config import PipelineConfig
    from memllm_jax.bench.host import RECORDED_FLAGS, cpu_info

    Pipeline(PipelineConfig(), tmp_path, say=lambda msg: None).run(stages=())
    host = json.loads((tmp_path / "host.json").read_text())
    assert host["cores"] == os.cpu_count() and set(host["flags"]) <= set(RECORDED_FLAGS)
    assert "matmul_dtype" in host and host["jax"] and datetime.datetime.fromisoformat(host["when"])
    assert cpu_info("processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 amx_bf16 sse\n\nprocessor\t: 1\n"
                    "model name\t: Other\n") == ("Some CPU", ["avx2", "amx_bf16"])
    assert cpu_info("") == (None, [])
    md = results_markdown([read_run(tmp_path)])
    assert f"- host: {host['cpu'] or 'CPU model unknown'}, {host['cores']} cores" in md and "No results yet." in md


def test_table2_chart_labels_and_legend_never_overlap():
    from experiments.tables import table2_figure
    from memllm_jax.eval.rows import ROWS

    results = {k: {"ppl": {"overall": 3.0 + i, "target": 1.2 * 3 ** (i % 6), "entity": 2.5 + i}}
               for i, k in enumerate(ROWS)}
    for keys in (list(ROWS), ["baseline1", "baseline2", "row3"]):
        fig = table2_figure({k: results[k] for k in keys})
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        labels = [t.get_window_extent(renderer) for t in ax.get_xticklabels()]
        assert [t.get_text() for t in ax.get_xticklabels()][:2] == ["Baseline\n#1", "Baseline\n#2"]
        assert all(left.x1 < right.x0 for left, right in zip(labels, labels[1:]))  # each label clear of the next
        assert not ax.get_legend().get_window_extent(renderer).overlaps(ax.get_window_extent(renderer))


def test_help_lists_the_report_command_without_importing_jax():
    import subprocess
    import sys

    code = ("import sys; from memllm_jax.cli import build_parser; build_parser().print_help(); "
            "print('jax loaded:', 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "report" in out and "RESULTS.md from run directories" in out and "jax loaded: False" in out
