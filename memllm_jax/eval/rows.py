"""The rows of Table 2 (paper §4.2): which model, which memory and how reads are made.

Memory sources: "none" (no memory: reads disabled), "mw_eval" (written by the memory-write model from the
evaluation documents), "mw_outside_large" / "mw_outside_small" (written by the memory-write model from a
large / small corpus outside the evaluation set), "gold" (the evaluation documents' gold triples).
"""

from __future__ import annotations

import dataclasses

from memllm_jax.eval.perplexity import ReadSetting


@dataclasses.dataclass(frozen=True)
class Row:
    key: str
    """Short id used in configs and JSON ("baseline1", "row3", ...)."""
    name: str
    """The paper's label (Baseline #1, ①, ...)."""
    description: str
    model: str
    """"base" (pretrained model, no adapter) or "mr" (memory-read adapter)."""
    memory: str
    read: ReadSetting


_NO_READ = ReadSetting(positions="none")
ROWS: dict[str, Row] = {r.key: r for r in [
    Row("baseline1", "Baseline #1", "base model (no memory)", "base", "none", _NO_READ),
    Row("baseline2", "Baseline #2", "memory-read model, memory disabled", "mr", "none", _NO_READ),
    Row("row1", "①", "MemLLM, MW[large outside corpus]", "mr", "mw_outside_large", ReadSetting()),
    Row("row2", "②", "MemLLM, MW[small outside corpus]", "mr", "mw_outside_small", ReadSetting()),
    Row("row3", "③", "MemLLM, MW[evaluation corpus]", "mr", "mw_eval", ReadSetting()),
    Row("row4", "④", "③ + gold MR positions & queries", "mr", "mw_eval", ReadSetting("gold", "gold", "memory")),
    Row("row5", "⑤", "MemLLM, gold triples of the evaluation corpus", "mr", "gold", ReadSetting()),
    Row("row6", "⑥", "⑤ + gold MR position", "mr", "gold", ReadSetting("gold", "model", "memory")),
    Row("row7", "⑦", "⑥ + gold queries", "mr", "gold", ReadSetting("gold", "gold", "memory")),
    Row("row8", "⑧", "⑦ + gold target added to the results", "mr", "gold", ReadSetting("gold", "gold", "memory+gold")),
    Row("row9", "⑨", "⑦ + gold target only", "mr", "gold", ReadSetting("gold", "gold", "gold_only")),
]}

PAPER_TABLE2: dict[str, tuple[str, float, float, float]] = {
    "baseline1": ("(no memory)", 5.823, 3.550, 4.666),
    "baseline2": ("(memory disabled)", 4.997, 3.510, 4.353),
    "row1": ("MW[Wikipedia (Full)]", 4.905, 2.986, 4.187),
    "row2": ("MW[Wikipedia (Abs.)]", 4.898, 2.955, 4.170),
    "row3": ("MW[Re-DocRED (Test)]", 4.863, 2.821, 4.102),
    "row4": ("+ Gold MR Pos. & Queries", 4.634, 1.938, 3.548),
    "row5": ("Re-DocRED (Test)", 4.811, 2.596, 3.993),
    "row6": ("+ Gold MR Position", 4.674, 2.232, 3.728),
    "row7": ("+ Gold Queries", 4.431, 1.364, 3.149),
    "row8": ("+ Gold Target", 4.426, 1.357, 3.142),
    "row9": ("+ Gold Target Only", 4.385, 1.194, 3.026),
}
"""The paper's published Table 2 (Mistral-7B on Re-DocRED): memory, OVERALL, TARGET, ENTITY."""

PAPER_TABLE3: dict[str, tuple[float, float, float, float]] = {
    "DEFER": (0.02, 0.02, 0.67, 0.24),
    "GRACE": (1.00, 0.02, 1.00, 0.67),
    "WISE": (0.70, 0.67, 1.00, 0.79),
    "MemLLM": (0.78, 0.76, 0.97, 0.84),
}
"""The paper's published Table 3 (Mistral-7B, ZsRE, T = 1000 sequential edits): REL, GEN, LOC, AVG."""


def get_rows(keys) -> list[Row]:
    unknown = [k for k in keys if k not in ROWS]
    if unknown:
        raise ValueError(f"unknown Table 2 row(s) {unknown}; known: {sorted(ROWS)}")
    return [ROWS[k] for k in keys]
