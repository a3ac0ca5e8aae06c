"""Self-contained HTML pages: one style sheet (tables, charts, read traces, memory calls), escaping and tables.
The charts and read traces are memllm_jax/eval/html.py's; `memllm generate --html` writes a page too."""

from __future__ import annotations

import html
import math
import os
import pathlib
import re
from typing import Sequence

from memllm_jax.files import atomic_write_text

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1180px;
 color:#1d2330;line-height:1.45;padding:0 16px}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #d8dde6;padding-bottom:.2em}
table{border-collapse:collapse;margin:.6em 0 1em;font-size:.92em}
th,td{border:1px solid #d8dde6;padding:3px 8px;text-align:left;vertical-align:top}th{background:#f1f4f9}
td.n{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#5b6475;font-size:.9em}.charts{display:flex;flex-wrap:wrap;gap:18px}
svg{background:#fff;border:1px solid #e3e7ee}
.trace{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:13.5px;line-height:2.1;white-space:pre-wrap;
 border:1px solid #d8dde6;padding:10px;background:#fcfcfd}
.tok{border-radius:2px}.tok.target{outline:1.5px solid #3759c7;outline-offset:-1px}
.tok.entity{text-decoration:underline dotted #777}
.tok.helped{box-shadow:inset 0 -3px 0 #1a9b50}.tok.hurt{box-shadow:inset 0 -3px 0 #d2352b}
.call{font-size:11.5px;border-radius:4px;padding:1px 4px;margin:0 2px;border:1px solid}
.call.used{background:#e6f4ea;border-color:#1a9b50}.call.removed{background:#f4f4f4;border-color:#999;color:#666;
 text-decoration:line-through}.call .res{font-weight:600}
.legend span{display:inline-block;padding:0 6px;margin-right:6px;border-radius:2px}
details{margin:.5em 0}summary{cursor:pointer;font-weight:600}
"""


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{esc(title)}</title>"
            f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n")


def write_page(path: str | os.PathLike, title: str, body: str) -> pathlib.Path:
    """Write the page atomically (temp file, then rename)."""
    atomic_write_text(path, page(title, body))
    return pathlib.Path(path)


def table(headers: Sequence[str], rows: Sequence[Sequence], caption: str = "", cls: str = "") -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(td(_cell(c)) for c in r) + "</tr>" for r in rows)
    cap = f"<caption class=\"note\">{esc(caption)}</caption>" if caption else ""
    return f"<table class=\"{cls}\">{cap}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_NUMBER = re.compile(r"^[–-]?$|^[-+]?[\d,.]+%?( \([\d.,%]+\))?$")


def td(content_html: str) -> str:
    """A table cell, right-aligned when it holds a number (or a number with a count in brackets)."""
    plain = re.sub(r"<[^>]+>", "", content_html).strip()
    return f"<td class=\"n\">{content_html}</td>" if _NUMBER.match(plain) else f"<td>{content_html}</td>"


def _cell(c) -> str:
    if isinstance(c, float):
        return "–" if not math.isfinite(c) else (f"{c:.3f}" if abs(c) < 1000 else f"{c:,.0f}")
    return "–" if c is None else esc(c)
