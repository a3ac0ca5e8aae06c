"""Self-contained HTML: SVG charts and read traces in one file that needs no network and no script (the page,
its style and tables: memllm_jax/html.py).

Used by the pipeline's report stage (`experiments/report_html.py` builds `results/index.html`). Charts are
inline SVG drawn here (a log axis where values span more than a factor of 20), so the page renders the same in
any browser and in a headless screenshot.
"""

from __future__ import annotations

import math
from typing import Sequence

from memllm_jax.html import esc, table, td, write_page  # noqa: F401  (td, write_page: for the report)

# ------------------------------------------------------------------------------------------------ charts

PALETTE = ("#3759c7", "#d2352b", "#1a9b50", "#e08e0b", "#7d3cb5", "#0f8b8d", "#a05a2c", "#555555")


def _ticks(lo: float, hi: float, log: bool) -> list[float]:
    if log:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        out = []
        for e in range(a, b + 1):
            out += [m * 10.0 ** e for m in ((1, 2, 5) if b - a <= 3 else (1,))]
        return [t for t in out if lo <= t <= hi] or [lo, hi]
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-12))) if hi > lo else 1.0
    while (hi - lo) / step > 8:
        step *= 2
    t, out = math.floor(lo / step) * step, []
    while t <= hi + 1e-9:
        if t >= lo - 1e-9:
            out.append(round(t, 10))
        t += step
    return out


def needs_log(values: Sequence[float]) -> bool:
    vals = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return bool(vals) and max(vals) / min(vals) > 20


class _Axis:
    def __init__(self, lo, hi, log, y0, y1):
        if log:
            lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
        elif lo == hi:
            lo, hi = lo - 1, hi + 1
        self.lo, self.hi, self.log, self.y0, self.y1 = lo, hi, log, y0, y1

    def __call__(self, v: float) -> float:
        f = (lambda x: math.log10(max(x, 1e-12))) if self.log else (lambda x: x)
        return self.y0 + (f(v) - f(self.lo)) / (f(self.hi) - f(self.lo)) * (self.y1 - self.y0)

    def ticks(self):
        return _ticks(self.lo, self.hi, self.log)


def _fmt(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e4 else f"{v:.0e}"


def _frame(w, h, title, yaxis, ylabel, left, top, bottom) -> list[str]:
    out = [f"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" "
           f"font-family=\"sans-serif\" font-size=\"11\" role=\"img\"><title>{esc(title)}</title>",
           f"<text x=\"{w / 2}\" y=\"16\" text-anchor=\"middle\" font-size=\"13\" font-weight=\"600\">{esc(title)}</text>"]
    for t in yaxis.ticks():
        y = yaxis(t)
        out.append(f"<line x1=\"{left}\" x2=\"{w - 10}\" y1=\"{y:.1f}\" y2=\"{y:.1f}\" stroke=\"#e6e9ef\"/>"
                   f"<text x=\"{left - 4}\" y=\"{y + 4:.1f}\" text-anchor=\"end\">{_fmt(t)}</text>")
    out.append(f"<text transform=\"translate(12,{(top + h - bottom) / 2}) rotate(-90)\" text-anchor=\"middle\">"
               f"{esc(ylabel)}{' (log scale)' if yaxis.log else ''}</text>")
    return out


def _legend(names: Sequence[str], x: float, y: float) -> list[str]:
    out = []
    for i, n in enumerate(names):
        out.append(f"<rect x=\"{x}\" y=\"{y + 15 * i - 8}\" width=\"10\" height=\"10\" fill=\"{PALETTE[i % len(PALETTE)]}\"/>"
                   f"<text x=\"{x + 14}\" y=\"{y + 15 * i + 1}\">{esc(n)}</text>")
    return out


def bar_chart(title: str, groups: Sequence[str], series: dict[str, Sequence[float | None]], ylabel: str,
              log: bool | None = None, width: int = 760, height: int = 320) -> str:
    """Grouped bars: one group per label in `groups`, one bar per series; values printed above the bars."""
    values = [v for vs in series.values() for v in vs if v is not None and math.isfinite(v)]
    if not values:
        return ""
    log = needs_log(values) if log is None else log
    left, top, bottom, legend_w = 56, 28, 40, 110
    lo = min(v for v in values if v > 0) if log else min(0.0, min(values))
    y = _Axis(lo, max(values), log, height - bottom, top)
    out = _frame(width, height, title, y, ylabel, left, top, bottom)
    plot_w = width - left - 10 - legend_w
    gw = plot_w / max(len(groups), 1)
    bw = gw * 0.8 / max(len(series), 1)
    for g, label in enumerate(groups):
        x0 = left + g * gw + gw * 0.1
        out.append(f"<text x=\"{left + (g + 0.5) * gw:.1f}\" y=\"{height - bottom + 14}\" text-anchor=\"middle\">"
                   f"{esc(label)}</text>")
        for s, (name, vs) in enumerate(series.items()):
            v = vs[g]
            if v is None or not math.isfinite(v) or (log and v <= 0):
                continue
            top_y, base = y(v), y(y.lo) if log else y(0.0)
            x = x0 + s * bw
            out.append(f"<rect x=\"{x:.1f}\" y=\"{min(top_y, base):.1f}\" width=\"{bw * 0.92:.1f}\" "
                       f"height=\"{abs(base - top_y):.1f}\" fill=\"{PALETTE[s % len(PALETTE)]}\"><title>{esc(label)} "
                       f"{esc(name)}: {v:.3f}</title></rect>")
            if len(groups) * len(series) <= 40:
                out.append(f"<text x=\"{x + bw * 0.46:.1f}\" y=\"{top_y - 3:.1f}\" text-anchor=\"middle\" "
                           f"font-size=\"8.5\">{v:.3g}</text>")
    out += _legend(list(series), width - legend_w + 6, top + 10)
    return "".join(out) + "</svg>"


def line_chart(title: str, series: dict[str, Sequence[tuple[float, float]]], xlabel: str, ylabel: str,
               log: bool | None = None, width: int = 560, height: int = 300) -> str:
    """Lines (with dots for series of few points) of `(x, y)` points; log y when the range needs it."""
    pts = [p for ps in series.values() for p in ps if p[1] is not None and math.isfinite(p[1])]
    if not pts:
        return ""
    log = needs_log([p[1] for p in pts]) if log is None else log
    left, top, bottom, legend_w = 56, 28, 40, 130
    ys = [p[1] for p in pts if not log or p[1] > 0]
    yax = _Axis(min(ys), max(ys), log, height - bottom, top)
    xs = [p[0] for p in pts]
    xax = _Axis(min(xs), max(xs), False, left, width - 10 - legend_w)
    out = _frame(width, height, title, yax, ylabel, left, top, bottom)
    for t in xax.ticks():
        out.append(f"<text x=\"{xax(t):.1f}\" y=\"{height - bottom + 14}\" text-anchor=\"middle\">{_fmt(t)}</text>")
    out.append(f"<text x=\"{(left + width - legend_w) / 2}\" y=\"{height - 6}\" text-anchor=\"middle\">{esc(xlabel)}</text>")
    for s, (name, ps) in enumerate(series.items()):
        ps = [p for p in ps if p[1] is not None and math.isfinite(p[1]) and (not log or p[1] > 0)]
        color = PALETTE[s % len(PALETTE)]
        if len(ps) > 1:
            d = " ".join(f"{xax(x):.1f},{yax(v):.1f}" for x, v in ps)
            out.append(f"<polyline points=\"{d}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"1.6\"/>")
        if len(ps) <= 30:
            out += [f"<circle cx=\"{xax(x):.1f}\" cy=\"{yax(v):.1f}\" r=\"2.6\" fill=\"{color}\"><title>{esc(name)} "
                    f"{_fmt(x)}: {v:.4g}</title></circle>" for x, v in ps]
    out += _legend(list(series), width - legend_w + 6, top + 10)
    return "".join(out) + "</svg>"


# ------------------------------------------------------------------------------------------------ traces

LOSS_CAP = 8.0
"""Nats at which a token's shade is darkest."""
HELP_MARGIN = 1.0
"""A token whose loss drops (rises) by more than this many nats with memory is marked helped (hurt)."""


def _shade(loss: float) -> str:
    a = max(0.0, min(1.0, loss / LOSS_CAP))
    return f"rgba(226,74,51,{0.08 + 0.72 * a:.2f})" if loss > 0.05 else "rgba(255,255,255,0)"


def trace_legend() -> str:
    cells = "".join(f"<span style=\"background:{_shade(v)}\">{v:g} nats</span>" for v in (0.5, 2, 4, 8))
    return (f"<p class=\"legend note\">Each token: upper half shaded by its loss <b>without</b> memory, lower half "
            f"<b>with</b> memory: {cells} &nbsp;<span class=\"tok target\">TARGET</span> "
            f"<span class=\"tok entity\">entity</span> <span class=\"tok helped\">memory helped (&gt;{HELP_MARGIN:g} "
            f"nat)</span> <span class=\"tok hurt\">memory hurt</span> &nbsp;<span class=\"call used\">read used</span>"
            f" <span class=\"call removed\">read removed</span></p>")


def _call_box(e: dict) -> str:
    used = e["status"] == "used"
    res = ", ".join(e["results"]) if e["results"] else "∅"
    queries = "; ".join(e["queries"]) or "–"
    tip = (f"read at token {e['token']}: {e['status']}" + (f", context until token {e.get('until')}" if used else "")
           + f" | queries: {queries} | results: {res} | gold: {'; '.join(e['gold_queries']) or '–'} -> "
             f"{', '.join(e['targets']) or '–'}")
    label = e["call"] or "({MEM_READ(" + queries + ")"
    reason = "" if used else f" <i>removed: {esc(e['status'])}</i>"
    return (f"<span class=\"call {'used' if used else 'removed'}\" title=\"{esc(tip)}\">{esc(label)} "
            f"<span class=\"res\">→ {esc(res)}</span>{reason}</span>")


def trace_view(trace: dict, title: str = "") -> str:
    """One document: its tokens shaded by loss with / without memory, every read inline, and a read table."""
    by_token: dict[int, list[dict]] = {}
    for e in trace["reads"]:
        by_token.setdefault(e["token"], []).append(e)
    parts = []
    for i, text in enumerate(trace["tokens"]):
        for e in by_token.get(i, []):
            parts.append(_call_box(e))
        w, wo = trace["loss_with"][i], trace["loss_without"][i]
        cls = ["tok"] + [k for k in ("target", "entity") if trace[k][i]]
        cls += ["helped"] if wo - w > HELP_MARGIN else ["hurt"] if w - wo > HELP_MARGIN else []
        style = f"background:linear-gradient(to bottom,{_shade(wo)} 50%,{_shade(w)} 50%)"
        parts.append(f"<span class=\"{' '.join(cls)}\" style=\"{style}\" title=\"loss with memory {w:.2f}, "
                     f"without {wo:.2f} nats\">{esc(text)}</span>")
    rows = [(e["token"], e["call"] or "–", "; ".join(e["queries"]) or "–", ", ".join(e["results"]) or "∅",
             e["status"] + (f" (until token {e['until']})" if "until" in e else ""),
             "; ".join(e["gold_queries"]) or "–", ", ".join(e["targets"]) or "–", "yes" if e["target_hit"] else "no")
            for e in trace["reads"]]
    reads = table(["token", "call", "queries", "results", "fate", "gold queries", "targets", "target in results"],
                  rows, cls="reads") if rows else "<p class=\"note\">no reads</p>"
    head = f"<h3>{esc(title or trace['doc'])}</h3>"
    return f"<div class=\"doc-trace\">{head}{_trace_summary(trace)}<div class=\"trace\">{''.join(parts)}</div>{reads}</div>"


def _trace_summary(trace: dict) -> str:
    from memllm_jax.eval.trace import summarize

    s = summarize(trace)
    return (f"<p class=\"note\">mean loss (nats/token): TARGET {s['target_with']:.2f} with memory, "
            f"{s['target_without']:.2f} without; all tokens {s['all_with']:.2f} with, {s['all_without']:.2f} without; "
            f"{sum(e['status'] == 'used' for e in trace['reads'])} of {len(trace['reads'])} reads used</p>")
