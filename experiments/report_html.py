"""`results/index.html`: one self-contained page of a pipeline run, built from its files alone (no model).

Sections: held-out and copy diagnostics, Table 2 with its chart (log scale when the perplexities span more
than a factor of 20) and the read diagnostics, Table 3, scaling, two-hop questions with
the model's read chains, the roofline table (`roofline_table`), the
training curves of `train/*/metrics.jsonl`, and the read traces the table2 stage saved in `results/traces/<row>.json` (first documents of each row). The
tables are the report's markdown tables (experiments/tables.py) rendered as HTML, so both always agree.
"""

from __future__ import annotations

import json
import pathlib
import re
from typing import Any

from experiments.roofline_table import table_markdown
from memllm_jax.eval import html as H

TRACE_ROWS_OPEN = ("row3",)
"""Rows whose traces are expanded when the page opens (the model's own reads on its own memory)."""


def _inline(text: str) -> str:
    out = H.esc(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def markdown_to_html(md: str) -> str:
    """The subset the report's markdown uses: `#` headings, `**bold**` / `code`, pipe tables, paragraphs."""
    out, rows = [], []

    def flush():
        if rows:
            head, body = rows[0], [r for r in rows[1:] if not set("".join(r)) <= set("-: ")]
            out.append("<table><thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead><tbody>"
                       + "".join("<tr>" + "".join(H.td(_inline(c)) for c in r) + "</tr>" for r in body)
                       + "</tbody></table>")
            rows.clear()

    for line in md.splitlines():
        s = line.strip()
        if s.startswith("|"):
            rows.append([c.strip() for c in s.strip("|").split("|")])
            continue
        flush()
        if s.startswith("!["):
            continue  # images: the page draws its own charts
        if s.startswith("#"):
            level = min(len(s) - len(s.lstrip("#")) + 1, 4)
            out.append(f"<h{level}>{_inline(s.lstrip('#').strip())}</h{level}>")
        elif s:
            out.append(f"<p>{_inline(s)}</p>")
    flush()
    return "\n".join(out)


def _load(path: pathlib.Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def table2_chart(results: dict) -> str:
    from memllm_jax.eval.rows import ROWS

    keys = [k for k in ROWS if k in results]
    series = {m.upper(): [results[k].get("ppl", {}).get(m) for k in keys] for m in ("overall", "target", "entity")}
    return H.bar_chart("Table 2: perplexity per row", [ROWS[k].name for k in keys], series, "perplexity", width=860)


def training_curves(run: pathlib.Path) -> str:
    """One chart per training run: train loss and held-out loss against the step."""
    charts = []
    for metrics in sorted(run.glob("train/*/metrics.jsonl")):
        series: dict[str, list] = {}
        for line in metrics.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if "loss" in rec and "step" in rec:
                series.setdefault(f"{rec.get('kind', 'train')} loss", []).append((rec["step"], rec["loss"]))
        if series:
            charts.append(H.line_chart(f"{metrics.parent.name}: loss (nats/token)", series, "step", "loss"))
    return "<div class=\"charts\">" + "".join(charts) + "</div>" if charts else ""


def scaling_chart(scaling: Any) -> str:
    points = (scaling or {}).get("points") if isinstance(scaling, dict) else None
    if not points:
        return ""
    series = {m.upper(): [(p["triples"], p["ppl"].get(m)) for p in points] for m in ("target", "entity", "overall")}
    return H.line_chart("Perplexity vs distractor triples in memory", series, "triples", "perplexity")


def traces_section(results: pathlib.Path) -> str:
    from memllm_jax.eval.rows import ROWS

    parts = []
    files = {p.stem: p for p in (results / "traces").glob("*.json")}
    for key in [k for k in ROWS if k in files] + sorted(k for k in files if k not in ROWS):
        traces = _load(files[key]) or []
        if not traces:
            continue
        row = ROWS.get(key)
        title = f"{row.name}: {row.description}" if row else key
        docs = "".join(H.trace_view(t, f"document {t['doc']}") for t in traces)
        parts.append(f"<details{' open' if key in TRACE_ROWS_OPEN else ''}><summary>{H.esc(title)} "
                     f"({len(traces)} documents)</summary>{docs}</details>")
    if not parts:
        return ""
    return "<h2 id=\"traces\">Read traces</h2>" + H.trace_legend() + "".join(parts)


def two_hop_chains(result: Any) -> str:
    """The first two-hop questions with the reads the model chained (each call, what it returned and whether it
    left the context) and its answers."""
    examples = (result or {}).get("examples") if isinstance(result, dict) else None
    if not examples:
        return ""
    rows = []
    for e in examples:
        reads = "<br>".join(f"<code>{H.esc(c['call'])}</code> → {H.esc(', '.join(c['result']) or '∅')}"
                            + (f" <span class=\"note\">(removed: {H.esc(c['removed'])})</span>" if c["removed"] else "")
                            for c in e["trace"]) or "–"
        mark = "✓" if e["exact"] else "✗"
        rows.append(f"<tr><td>{H.esc(e['question'])}</td><td>{reads}</td><td>{H.esc(e['with_memory'])} {mark}</td>"
                    f"<td>{H.esc(e['answer'])} (via {H.esc(e['middle'])})</td><td>{H.esc(e['without_memory'])}</td></tr>")
    return ("<details open><summary>Read chains of the first questions</summary><table><tr><th>question</th>"
            "<th>the model's reads</th><th>answer with memory</th><th>expected</th><th>without memory</th></tr>"
            + "".join(rows) + "</table></details>")


def build(run: str | pathlib.Path) -> pathlib.Path:
    """Write `<run>/results/index.html` from the run's result files and training metrics."""
    from experiments.tables import diagnostics_markdown, read_diagnostics_markdown, table2_markdown

    run = pathlib.Path(run)
    res = run / "results"
    config = _load(run / "config.json") or {}
    body = [f"<h1>MemLLM ({H.esc(config.get('name', run.name))}) results</h1>",
            f"<p class=\"note\">Output directory <code>{H.esc(run)}</code>. Everything on this page is in this file "
            f"(no network). TensorBoard: <code>tensorboard --logdir {H.esc(run.parent)}</code>.</p>"]
    diag = diagnostics_markdown(_load(res / "corpus.json"), _load(res / "diagnostics.json"))
    if diag:
        body += ["<h2>Diagnostics</h2>", markdown_to_html(diag)]
    t2 = _load(res / "table2.json")
    if t2:
        body += ["<h2 id=\"table2\">Table 2</h2>", markdown_to_html(table2_markdown(t2)), table2_chart(t2),
                 markdown_to_html(read_diagnostics_markdown(t2))]
    t3 = sorted(res.glob("table3*.md"))
    if t3:
        body += ["<h2 id=\"table3\">Table 3</h2>"] + [markdown_to_html(p.read_text()) for p in t3]
    if (res / "scaling.md").exists():
        body += ["<h2>Scaling</h2>", markdown_to_html((res / "scaling.md").read_text()),
                 scaling_chart(_load(res / "scaling.json"))]
    if (res / "two_hop.md").exists():
        body += ["<h2 id=\"two-hop\">Two-hop questions</h2>", markdown_to_html((res / "two_hop.md").read_text()),
                 two_hop_chains(_load(res / "two_hop.json"))]
    if any(run.glob("stages/*.json")):
        body += ["<h2 id=\"roofline\">Roofline</h2>", markdown_to_html(table_markdown(_load(res / "roofline.json")))]
    curves = training_curves(run)
    if curves:
        body += ["<h2>Training curves</h2>", curves]
    body.append(traces_section(res))
    return H.write_page(res / "index.html", f"MemLLM {config.get('name', run.name)} results", "\n".join(body))


def chromium() -> str | None:
    """The headless browser used for screenshots and the browser test (Debian's `chromium` package)."""
    import shutil

    return next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def render(page: str | pathlib.Path, *, screenshot: str | pathlib.Path | None = None, width: int = 1280,
           height: int = 2400, timeout: float = 120.0) -> tuple[str, str]:
    """Load `page` in headless Chromium: `(DOM after loading, browser log)`; with `screenshot`, also a PNG."""
    import subprocess

    exe = chromium()
    if exe is None:
        raise FileNotFoundError("chromium: not installed (apt-get install chromium)")
    url = pathlib.Path(page).absolute().as_uri()
    common = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
              "--enable-logging=stderr", "--v=0", f"--window-size={width},{height}"]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=timeout, check=True)
    if screenshot is not None:
        subprocess.run([*common, f"--screenshot={pathlib.Path(screenshot).absolute()}", url], capture_output=True,
                       text=True, timeout=timeout, check=True)
    return dom.stdout, dom.stderr
