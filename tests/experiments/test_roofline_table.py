"""The roofline table of a run (`experiments/roofline_table.py`): each stage's FLOPs against a hand count, the
host's ceilings measured once and cached, compile seconds from JAX's events, the table in the reports."""

import json

import pytest

from experiments import roofline_table as R
from experiments.report_markdown import read_run, results_markdown
from memllm_jax.config import DEFAULT_TINY, LoraConfig

CEILINGS = {"matmul_flops": 100e9, "matmul": "matmul ceiling 100.0 GFLOP/s (jax float32 2048^3)",
            "bandwidth_bytes_per_s": 10e9}


def hand_counts(cfg):
    """Per token: the layers' matmuls (2P each), the LM head; per (query, key) pair: attention, by hand."""
    D, N, K, H, F, V, n = (cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_ff, cfg.vocab_size,
                           cfg.n_layers)
    P = D * N * H + 2 * D * K * H + N * H * D + 3 * D * F
    return 2 * n * P, 2 * D * V, 4 * n * N * H, n * P


def test_training_and_write_flops_match_a_hand_count():
    cfg = DEFAULT_TINY
    body, head, pair, matmul_params = hand_counts(cfg)
    lora = LoraConfig(rank=4, alpha=8.0, dropout=0.0, targets=("q", "v"))
    w = R.Work()
    w.training(cfg, lora, steps=3, batch=2, seq_len=8)
    T = 2 * 8
    D, NH, KH = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    adapters = cfg.n_layers * 4 * ((D + NH) + (D + KH))  # rank 4 x (inputs + outputs) of q and v
    # frozen base: forward + input gradients of the matmuls and head, attention 3x, adapters 6x
    step = 2 * body * T + 2 * head * T + 3 * pair * 2 * 8 * 8 + 6 * adapters * T
    assert w.trained_tokens == 3 * T and w.flops == pytest.approx(3 * step)
    full = R.Work()
    full.training(cfg, None, steps=1, batch=2, seq_len=8)
    assert full.flops == pytest.approx(3 * (T * (body + head) + pair * 2 * 8 * 8))

    w = R.Work()
    w.writes(cfg, [[1, 2, 3], [1, 2, 4]], decoded=4, batch=2)
    # prefix trie nodes at positions 0, 1, 2 and 2 (the shared prefix [1, 2] once); logits at each prompt's end
    prefill = 4 * body + pair * (1 + 2 + 3 + 3) + 2 * head
    decode = 4 * (body + head) + pair * 4 * (3 + 1)  # a decoded token attends to its prompt and itself
    assert (w.prefilled_tokens, w.decoded_tokens) == (6, 4) and w.flops == pytest.approx(prefill + decode)
    embed = cfg.d_model * cfg.vocab_size * (1 if cfg.tie_embeddings else 2)
    assert w.weight_bytes_per_step == (matmul_params + embed) * 4 and w.decode_batch == 2

    f = R.Work()
    f.forwards(cfg, [5, 7])
    assert f.prefilled_tokens == 12 and f.flops == pytest.approx(12 * (body + head) + pair * (25 + 49))


def test_a_row_divides_the_work_by_the_run_time_less_compiling():
    work = {"flops": 50e9, "decoded_tokens": 100, "decode_batch": 10, "weight_bytes_per_step": 1e9,
            "compile_seconds": 1.0, "trained_tokens": 0, "prefilled_tokens": 40, "not_measured": ["x"]}
    row = R.stage_row("memory", 11.0, work, CEILINGS)
    assert row["gflops_per_s"] == pytest.approx(5.0) and row["of_ceiling"] == pytest.approx(0.05)
    assert row["of_bandwidth_bound"] == pytest.approx(10 * 1e9 / 10e9 / 10.0)  # 10 steps x 1 GB at 10 GB/s in 10 s
    line = R.row_line(row)
    assert line.startswith("[memory] roofline: 40 prefilled, 100 decoded; 50.0 GFLOP in 11.0s (1.0s compiling)")
    assert "5.00 GFLOP/s = 5.0% of the matmul ceiling" in line and "10.0% of the bandwidth bound at batch 10" in line
    assert R.row_line(R.stage_row("report", 1.0, None, None)) == "[report] roofline: not recorded"


def test_the_ceilings_are_measured_once_per_host_and_a_corrupt_cache_is_measured_over(tmp_path, monkeypatch):
    calls = []

    def measure(dtype):
        calls.append(dtype)
        return dict(CEILINGS)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(R, "share_reasons", lambda share: [])  # an idle host, whatever runs beside this test
    path = R.cache_path()
    assert path == tmp_path / "memllm_jax" / "host_ceilings.json"
    assert R.host_ceilings("float32", measure) == CEILINGS
    assert R.host_ceilings("float32", measure) == CEILINGS and calls == ["float32"]
    assert R.host_key("float32") in json.loads(path.read_text())
    R.host_ceilings("bfloat16", measure)  # another dtype: its own entry, the first kept
    assert calls == ["float32", "bfloat16"] and len(json.loads(path.read_text())) == 2
    path.write_text("{not json")
    assert R.host_ceilings("float32", measure) == CEILINGS and calls[-1] == "float32" and len(calls) == 3
    assert R.host_ceilings("float32", measure) == CEILINGS and len(calls) == 3


def test_a_ceiling_measured_on_a_busy_host_is_not_cached(tmp_path, monkeypatch):
    calls = []

    def measure(dtype):
        calls.append(dtype)
        return dict(CEILINGS)

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(R, "share_reasons", lambda share: ["other processes kept 80% of the CPU busy"])
    got = R.host_ceilings("bfloat16", measure)
    assert got["busy"] == "other processes kept 80% of the CPU busy" and not R.cache_path().exists()
    assert "measured while the host was busy" in R.table_markdown({"dtype": "bfloat16", "ceilings": got,
                                                                   "rows": [{"stage": "mw", "recorded": False}]})
    monkeypatch.setattr(R, "share_reasons", lambda share: [])
    assert R.host_ceilings("bfloat16", measure) == CEILINGS and calls == ["bfloat16", "bfloat16"]
    assert R.host_ceilings("bfloat16", measure) == CEILINGS and len(calls) == 2  # idle: cached


def test_compile_seconds_come_from_jax_events():
    import jax
    import jax.numpy as jnp

    with R.CompileClock() as clock:
        jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
    assert clock.seconds > 0
    seconds = clock.seconds
    jax.jit(lambda x: x - 1.0)(jnp.arange(3.0)).block_until_ready()  # after the context: not counted
    assert clock.seconds == seconds


def _run_dir(tmp_path, table):
    run = tmp_path / "run"
    (run / "stages").mkdir(parents=True)
    (run / "results").mkdir()
    (run / "config.json").write_text(json.dumps({"name": "demo"}))
    (run / "stages" / "corpus.json").write_text(json.dumps({"key": "k", "seconds": 2.0}))
    if table is not None:
        (run / "results" / "roofline.json").write_text(json.dumps(table))
    return run


def test_the_reports_show_the_table_and_an_older_run_says_not_recorded(tmp_path):
    from experiments.report_html import build

    work = {"flops": 8e9, "trained_tokens": 4096, "prefilled_tokens": 0, "decoded_tokens": 0, "compile_seconds": 0.5,
            "decode_batch": 0, "weight_bytes_per_step": 0, "not_measured": ["held-out evaluation"]}
    table = {"dtype": "float32", "ceilings": CEILINGS,
             "rows": [R.stage_row("mw", 4.5, work, CEILINGS), R.stage_row("report", 0.1, None, None)]}
    run = _run_dir(tmp_path / "new", table)
    md = results_markdown([read_run(run)])
    assert "**Roofline**" in md and "memory bandwidth 10.0 GB/s" in md
    assert "| mw | 4,096 trained | 8.0 | 4.5 | 0.5 | 2.00 | 2.0% | – | held-out evaluation |" in md
    assert "| report | not recorded |" in md
    html = build(run).read_text()
    assert "Roofline" in html and "4,096 trained" in html and "2.0%" in html

    old = _run_dir(tmp_path / "old", None)
    assert "**Roofline** — each stage's work against this host's ceilings (`results/roofline.json`): not recorded" \
        in results_markdown([read_run(old)])
    assert "not recorded" in build(old).read_text()


def test_a_pipeline_run_writes_a_row_per_stage(tmp_path):
    from experiments.configs import default_tiny
    from experiments.pipeline import Pipeline
    from memllm_jax.settings import replace

    cfg = replace(default_tiny.get_config(), {"data.synth_docs": 40, "data.eval_docs": 5, "tokenizer.vocab_size": 400})
    said = []
    Pipeline(cfg, tmp_path, said.append).run(("corpus", "tokenizer"))
    table = json.loads((tmp_path / "results" / "roofline.json").read_text())
    assert [r["stage"] for r in table["rows"]] == ["corpus", "tokenizer"] and table["ceilings"] is None
    assert all(r["recorded"] and r["flops"] == 0 for r in table["rows"])
    assert any(line.startswith("[corpus] roofline: no model work counted") for line in said)
    assert "compile_seconds" in json.loads((tmp_path / "stages" / "corpus.json").read_text())["work"]


@pytest.mark.slow
@pytest.mark.xdist_group("tiny_run")  # a unit of its own, so scheduled first (tests/conftest.py): the longest test
def test_a_tiny_run_writes_a_roofline_row_per_stage(tmp_path, monkeypatch):
    """The whole tiny pipeline (few steps): a row per stage, work where the stage counts it, the report's table."""
    from experiments.configs import default_tiny
    from experiments.pipeline import Pipeline
    from experiments.pipeline_config import STAGES
    from memllm_jax.settings import replace

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(R, "measure_ceilings", lambda dtype: dict(CEILINGS))
    monkeypatch.setattr(R, "share_reasons", lambda share: [])  # cached however busy the host is
    cfg = replace(default_tiny.get_config(), {
        "data.synth_docs": 80, "data.eval_docs": 5, "base.pretrain.steps": 6, "mw.steps": 6, "mr.steps": 6,
        "editing.n_edits": 2, "scaling.sizes": (0,), "table2.rows": ("baseline1", "row3")})
    said = []
    Pipeline(cfg, tmp_path / "run", said.append).run()
    table = json.loads((tmp_path / "run" / "results" / "roofline.json").read_text())
    rows = {r["stage"]: r for r in table["rows"]}
    assert list(rows) == list(STAGES) and table["ceilings"] == CEILINGS
    assert rows["mw"]["trained_tokens"] == 6 * cfg.mw.global_batch * cfg.mw.seq_len and rows["mw"]["of_ceiling"] > 0
    assert rows["memory"]["decoded_tokens"] > 0 and rows["memory"]["of_bandwidth_bound"] > 0
    assert rows["table2"]["prefilled_tokens"] > 0
    assert rows["editing"]["decoded_tokens"] > 0 and not rows["editing"]["not_measured"]
    assert all(r["compile_seconds"] >= 0 for r in rows.values())
    assert sum(line.startswith("[memory] roofline: ") for line in said) == 1
    assert "**Roofline**" in (tmp_path / "run" / "results" / "report.md").read_text()
