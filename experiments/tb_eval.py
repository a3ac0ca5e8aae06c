"""The evaluation results of a run as TensorBoard events in `<run>/tb_eval`, beside the training runs' own
`<run>/train/<name>/tb`, so `tensorboard --logdir outputs/` shows every run (and every sweep point) side by side.

Scalars: `table2/<row>/{overall,target,entity}` perplexities and `table2/<row>/{reads,reads_with_results,
target_in_results}`, `table3/<regime>/{rel,gen,loc,avg}` (step 0), `scaling/<span>` at step = distractor
triples. Text: the markdown tables (TensorBoard's text plugin renders them). The directory is rebuilt on each
report (written to a temp directory, then renamed), so a rerun does not duplicate events.
"""

from __future__ import annotations

import json
import pathlib
import shutil

EVAL_DIR = "tb_eval"


def _load(path: pathlib.Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def log_results(run: str | pathlib.Path) -> pathlib.Path | None:
    """Write `<run>/tb_eval` from `<run>/results/*.json`; None when there are no results yet."""
    from tensorboardX import SummaryWriter

    from experiments.tables import table2_markdown, table3_markdown

    run = pathlib.Path(run)
    res = run / "results"
    t2 = _load(res / "table2.json") or {}
    t3 = {p.stem: _load(p) for p in sorted(res.glob("table3*.json"))}
    t3 = {k: v for k, v in t3.items() if isinstance(v, dict) and v}
    scaling = _load(res / "scaling.json")
    if not (t2 or t3 or scaling):
        return None
    out, tmp = run / EVAL_DIR, run / (EVAL_DIR + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with SummaryWriter(str(tmp)) as w:
        for key, row in t2.items():
            for span, v in row.get("ppl", {}).items():
                w.add_scalar(f"table2/{key}/{span}", float(v), 0)
            for stat in ("reads", "reads_with_results", "target_in_results"):
                if stat in row.get("stats", {}):
                    w.add_scalar(f"table2/{key}/{stat}", float(row["stats"][stat]), 0)
        if t2:
            w.add_text("table2", table2_markdown(t2), 0)
        for name, regimes in t3.items():
            for regime, r in regimes.items():
                for m in ("rel", "gen", "loc", "avg"):
                    if isinstance(r, dict) and m in r:
                        w.add_scalar(f"{name}/{regime}/{m}", float(r[m]), 0)
            w.add_text(name, table3_markdown({k: v for k, v in regimes.items() if isinstance(v, dict) and "rel" in v}), 0)
        for p in (scaling or {}).get("points", []) if isinstance(scaling, dict) else []:
            for span, v in p.get("ppl", {}).items():
                w.add_scalar(f"scaling/{span}", float(v), int(p["triples"]))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
