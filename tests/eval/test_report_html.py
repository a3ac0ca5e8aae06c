"""The HTML report (`results/index.html`) and `memllm generate --html`: self-contained pages with the tables,
log-scale charts, training curves and read traces; the evaluation rows as TensorBoard events. The browser test
(`pytest -m browser`) loads the pages in headless Chromium."""

import json
import re
import struct

import numpy as np
import pytest

from experiments import report_html
from memllm_jax import protocol
from memllm_jax.eval.perplexity import ReadSetting, evaluate_perplexity
from tests.support.eval_fakes import scripted_reader


def make_run(tmp_path):
    """A run directory as the pipeline leaves it: results, training metrics and a row ③ trace."""
    model, tok, docs, Memory = scripted_reader()
    trace = evaluate_perplexity(model, tok, docs, Memory(), ReadSetting(), batch_size=2, trace_docs=1).traces
    run = tmp_path / "run"
    res = run / "results"
    (res / "traces").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"name": "demo"}))
    stats = {"reads": 5, "reads_with_results": 4, "target_in_results": 3, "gold_position_reads": 4,
             "query_entity_correct": 4, "query_relation_correct": 3, "query_exact": 3}
    (res / "table2.json").write_text(json.dumps({
        "baseline1": {"ppl": {"overall": 51.7, "target": 301.9, "entity": 115.4}, "stats": {"reads": 0}},
        "row3": {"ppl": {"overall": 5.9, "target": 9.95, "entity": 8.6}, "stats": stats},
        "row9": {"ppl": {"overall": 2.6, "target": 1.16, "entity": 2.5}, "stats": stats}}))
    (res / "table3.json").write_text(json.dumps({"sequential": {"n_edits": 20, "rel": 0.3, "gen": 0.3, "loc": 0.5,
                                                                "avg": 0.37}}))
    (res / "table3.md").write_text("**Table 3 analogue (ours)**\n\n| method | REL |\n|---|---|\n| MemLLM | 0.30 |\n")
    (res / "traces" / "row3.json").write_text(json.dumps(trace))
    (run / "train" / "mr").mkdir(parents=True)
    (run / "train" / "mr" / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "kind": k, "loss": 4.0 / s}) + "\n" for s in (1, 2, 4, 8) for k in ("train", "eval")))
    return run


@pytest.mark.slow
def test_report_page_is_self_contained_with_tables_charts_and_a_trace(tmp_path):
    page = report_html.build(make_run(tmp_path))
    html = page.read_text()
    assert page.name == "index.html" and html.startswith("<!DOCTYPE html>")
    assert html.count("<table") >= 4 and "Baseline #1" in html and "301.900" in html
    assert "perplexity (log scale)" in html  # TARGET spans 1.16 .. 302: log axis
    assert "mr: loss (nats/token)" in html  # training curves
    assert 'class="call used"' in html and "({MEM_READ(Ann&gt;&gt;place of birth&gt;&gt;)--&gt;" in html
    assert "→ Paris" in html and "loss with memory" in html
    # nothing is fetched: no scripts, no external stylesheets or images (the SVG namespace is not a fetch)
    assert "<script" not in html and not re.search(r"(src|href)=\"?https?:", html)
    assert not (tmp_path / "run" / "results" / "index.html.tmp").exists()


def test_markdown_tables_render_as_html():
    out = report_html.markdown_to_html("**T** — x\n\n| a | b |\n|---|---|\n| name | 1.5 |\n")
    assert "<b>T</b>" in out and "<th>a</th>" in out and '<td class="n">1.5</td>' in out and "<td>name</td>" in out


def _events(directory):
    """(tag, step, value or text) of every summary in a TensorBoard event directory (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    out = []
    for f in sorted(directory.glob("events.out.tfevents.*")):
        data, i = f.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 12 + n + 4
            for v in ev.summary.value:
                value = v.simple_value if v.HasField("simple_value") else v.tensor.string_val[0].decode()
                out.append((v.tag, ev.step, value))
    return out


@pytest.mark.slow
def test_evaluation_rows_become_tensorboard_scalars_and_text(tmp_path):
    from experiments.tb_eval import log_results

    run = make_run(tmp_path)
    out = log_results(run)
    assert out == run / "tb_eval"
    assert log_results(run) == out and len(list(out.glob("events.*"))) == 1  # rebuilt, not duplicated
    events = _events(out)
    scalars = {tag: value for tag, _, value in events if not isinstance(value, str)}
    assert scalars["table2/row3/target"] == pytest.approx(9.95) and scalars["table2/baseline1/overall"] == pytest.approx(51.7)
    assert scalars["table2/row3/reads"] == 5 and scalars["table3/sequential/rel"] == pytest.approx(0.3)
    texts = {tag.split("/")[0]: value for tag, _, value in events if isinstance(value, str)}
    assert "| row | memory / reads |" in texts["table2"] and "MemLLM (ours, sequential)" in texts["table3"]


def _generation():
    from memllm_jax.decode.reader import ApiCall, GenerationResult

    q = protocol.Query("Ilsa Varomek", "place of birth", None)
    calls = [ApiCall("({MEM_READ(Ilsa Varomek>>employer>>)-->", (protocol.Query("Ilsa Varomek", "employer", None),),
                     (), removed=True, reason="empty"),
             ApiCall("({MEM_READ(Ilsa Varomek>>place of birth>>)-->", (q,), ("Tharbon",))]
    text = " was born in ({MEM_READ(Ilsa Varomek>>place of birth>>)-->Tharbon})Tharbon."
    return GenerationResult([], [], text, " was born in Tharbon.", calls, "eos", 30)


def test_generate_html_shows_kept_and_removed_calls(tmp_path):
    from memllm_jax.decode.generate_cli import generation_page

    html = generation_page(tmp_path / "g.html", ["Ilsa Varomek"], [_generation()]).read_text()
    assert 'class="call used"' in html and "→ Tharbon" in html
    assert "removed: empty" in html and "kept in context" in html and "&lt;Ilsa Varomek, employer, *&gt;" in html


@pytest.mark.slow
def test_generate_command_writes_html(tmp_path, capsys):
    import dataclasses

    from flax import nnx

    from memllm_jax.cli import main
    from memllm_jax.config import TINY
    from memllm_jax.model.hf import save_hf
    from memllm_jax.model.decoder import Decoder
    from memllm_jax.tokenizer import train_tokenizer

    tok = train_tokenizer([protocol.escape_text("Paris is the capital of France.")] * 20, 300, tmp_path / "m")
    cfg = dataclasses.replace(TINY, vocab_size=tok.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
    save_hf(Decoder(cfg, rngs=nnx.Rngs(0)), tmp_path / "m")
    assert main(["generate", "--model", str(tmp_path / "m"), "Paris is", "--max-new-tokens", "4", "--show-memory",
                 "--html", str(tmp_path / "out.html")]) == 0
    assert "wrote" in capsys.readouterr().err
    assert "<h3>Paris is</h3>" in (tmp_path / "out.html").read_text()


@pytest.mark.browser
def test_pages_load_in_headless_chromium(tmp_path):
    """Real browser: the report and a generate page load with no console errors; the DOM has the tables, the
    chart and a trace; the screenshot is a real picture, not a blank page."""
    if report_html.chromium() is None:
        pytest.fail("chromium is not installed (apt-get install chromium)")
    from memllm_jax.decode.generate_cli import generation_page

    page = report_html.build(make_run(tmp_path))
    dom, log = report_html.render(page, screenshot=tmp_path / "shot.png")
    assert not re.search(r"Uncaught|CONSOLE\(\d+\).*[Ee]rror|Failed to load resource", log), log
    assert dom.count("<table") >= 4 and "<svg" in dom and 'class="trace"' in dom and "→ Paris" in dom
    from PIL import Image

    shot = np.asarray(Image.open(tmp_path / "shot.png").convert("RGB"))
    assert shot.shape[1] == 1280 and len(np.unique(shot.reshape(-1, 3), axis=0)) > 50
    gen = generation_page(tmp_path / "g.html", ["Ilsa Varomek"], [_generation()])
    dom, log = report_html.render(gen)
    assert "→ Tharbon" in dom and not re.search(r"Uncaught|Failed to load resource", log), log
