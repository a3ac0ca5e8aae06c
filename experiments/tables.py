"""Markdown tables in the paper's layout (with the paper's published Mistral-7B numbers alongside, labelled
as such) and PNG plots (matplotlib, Agg backend)."""

from __future__ import annotations

import math
import pathlib
from typing import Mapping, Sequence

from experiments.roofline_table import table_markdown
from memllm_jax.errors import load_json
from memllm_jax import protocol
from memllm_jax.eval.abstention import ABSENT_KEY
from memllm_jax.eval.editing import ERROR_KINDS
from memllm_jax.eval.rows import PAPER_TABLE2, PAPER_TABLE3, ROWS
from memllm_jax.files import atomic_open
from memllm_jax.eval.write_quality import threshold_label


def _f(x) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def table2_markdown(results: Mapping[str, Mapping], title: str = "Table 2 (ours)") -> str:
    """`results[row_key] = {"ppl": {overall, target, entity}, "stats": {...}}` in ROWS order."""
    lines = [f"**{title}** — perplexities; the right-hand columns are the paper's published Mistral-7B results "
             "on Re-DocRED (for reference, not comparable in scale).", "",
             "| row | memory / reads | OVERALL | TARGET | ENTITY | reads (with results) | paper OVERALL | paper TARGET | paper ENTITY |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, row in ROWS.items():
        if key not in results:
            continue
        r = results[key]
        ppl, st = r.get("ppl", {}), r.get("stats", {})
        paper = PAPER_TABLE2.get(key)
        reads = f"{st.get('reads', 0)} ({st.get('reads_with_results', 0)})" if st.get("reads") else "0"
        lines.append(f"| {row.name} | {row.description} | {_f(ppl.get('overall'))} | {_f(ppl.get('target'))} | "
                     f"{_f(ppl.get('entity'))} | {reads} | "
                     + (" | ".join(_f(v) for v in paper[1:]) if paper else "– | – | –") + " |")
    return "\n".join(lines)


def table3_markdown(results: Mapping[str, Mapping], title: str = "Table 3 analogue (ours)",
                    beyond_paper: str = "") -> str:
    """`results[regime]`, and the absent-fact block under `abstention.ABSENT_KEY` when it was asked. `beyond_paper`:
    what the paper lacks that these edits measure, said instead of the paper's rows."""
    absent = results.get(ABSENT_KEY)
    results = {k: v for k, v in results.items() if k != ABSENT_KEY}
    lead = (f"not in the paper: {beyond_paper}." if beyond_paper else "the paper's rows are its published Mistral-7B "
            "ZsRE results (T = 1000 sequential edits), for reference.")
    lines = [f"**{title}** — knowledge editing; {lead}", "",
             "| method | edits (T) | REL | GEN | LOC | AVG | edits held in memory: n (REL / GEN on them) |",
             "|---|---|---|---|---|---|---|"]
    for regime, r in results.items():
        t = r["n_edits"] if regime == "sequential" else 1
        held = (f"{r['edits_in_memory']} of {r['n_edits']} ({r['rel_in_memory']:.2f} / {r['gen_in_memory']:.2f})"
                if "edits_in_memory" in r else "–")
        lines.append(f"| MemLLM (ours, {regime}) | {t} | {r['rel']:.2f} | {r['gen']:.2f} | {r['loc']:.2f} | {r['avg']:.2f} "
                     f"| {held} |")
    notes = [f"{n} of {r['n_edits']} {regime} edits are about a subject that a later edit gives another answer: "
             f"written with one relation per subject, the later edit replaces theirs (REL at most "
             f"{1 - n / r['n_edits']:.2f})." for regime, r in results.items() if (n := r.get("overwritten_later", 0))]
    notes += [f"Wrong answers of the {regime} regime by where the edit was lost (REL / GEN): "
              + ", ".join(f"{what} {r['errors_rel'].get(k, 0)} / {r['errors_gen'].get(k, 0)}"
                          for k, what in ERROR_KINDS.items()) + "."
              for regime, r in results.items() if r.get("errors_rel")]
    for name, (rel, gen, loc, avg) in PAPER_TABLE3.items() if not beyond_paper else ():
        lines.append(f"| {name} (paper, Mistral-7B) | 1000 | {rel:.2f} | {gen:.2f} | {loc:.2f} | {avg:.2f} | – |")
    return "\n".join(lines + ([""] + notes if notes else []) + (["", absent_markdown(absent)] if absent else []))


def absent_markdown(r: Mapping) -> str:
    """Table 3's absent-fact block (`eval.abstention`): how the read model answers what the memory does not hold."""
    kept = "kept in the context" if r["keep_empty"] else "removed, as in the paper"
    present = f"{r['rel_present']:.2f} / {r['gen_present']:.2f}" if r.get("rel_present") is not None else "–"
    return "\n".join([
        f"**Absent facts** — {r['n_questions']} questions about held-out facts the memory of the sequential edits "
        f"does not hold (empty reads {kept}); not in the paper, which is not memory-aware.", "",
        f"| answers | abstained (\"{protocol.ABSTAIN}\") | named a guess | the fact's object | forced read empty "
        "| REL / GEN on present facts |", "|---|---|---|---|---|---|",
        f"| MemLLM (ours, sequential) | {r['abstention']:.2f} | {r['named_guess']:.2f} | {r['correct_guess']:.2f} "
        f"| {r['empty_reads']:.2f} | {present} |"])


def two_hop_markdown(r: Mapping) -> str:
    """The two-hop block (`eval.two_hop`): composite relations answered by two reads."""
    n = r["n_questions"]
    return "\n".join([
        f"**Two-hop questions** — {n} questions over two facts of the evaluation documents (\"What is the r2 of the r1 "
        "of X?\"), the memory holding the one-hop facts; not in the paper, which does not use composite relations.",
        "", "| answers | exact |", "|---|---|",
        f"| with memory (the model's reads) | {r['exact_with_memory']:.2f} |",
        f"| without memory | {r['exact_without_memory']:.2f} |",
        f"| gold reads in the prompt (ceiling) | {r['exact_gold_reads']:.2f} |", "",
        f"With memory: a second read made on {r['chained']:.2f} of the questions; the first read returned the middle "
        f"entity on {r['first_read_hit']:.2f}, a later read the answer on {r['second_read_hit']:.2f}; the first read "
        + ("kept in the context when the second opened." if r.get("keep_reads") else
           "removed from the context when the second opened, as in the paper.")])


def read_diagnostics_markdown(results: Mapping[str, Mapping]) -> str:
    """Per Table 2 row that reads: reads issued, with results, with the target among the results, and (where
    the model writes queries at gold positions) how often its query names the gold entity / relation."""
    lines = ["**Memory-read diagnostics** — per row: reads, reads returning something, reads whose results contain "
             "the target; at gold read positions with the model's own queries, the fraction whose query names the "
             "gold entity / relation / equals a gold query", "",
             "| row | reads | with results | target in results | gold positions | query entity | query relation | query exact |",
             "|---|---|---|---|---|---|---|---|"]
    for key, row in ROWS.items():
        st = results.get(key, {}).get("stats", {})
        if not st.get("reads"):
            continue
        n_gold = st.get("gold_position_reads", 0)

        def frac(k):
            return f"{st.get(k, 0) / n_gold:.2f}" if n_gold else "–"

        lines.append(f"| {row.name} | {st['reads']} | {st.get('reads_with_results', 0)} | "
                     f"{st.get('target_in_results', 0)} ({st.get('target_in_results', 0) / st['reads']:.0%}) | {n_gold} | "
                     f"{frac('query_entity_correct')} | {frac('query_relation_correct')} | {frac('query_exact')} |")
    return "\n".join(lines)


def diagnostics_markdown(corpus: Mapping | None, diagnostics: Mapping | None) -> str:
    """The held-out check and the adapters' skills (results/corpus.json, results/diagnostics.json)."""
    lines: list[str] = []
    if corpus and corpus.get("overlap"):
        o = corpus["overlap"]
        lines += ["**Held-out evaluation** — how much of the evaluation corpus the training documents already state", "",
                  "| evaluation gold triples | of them in training documents | TARGET mentions | names in training text "
                  "| same, dates and years excluded |", "|---|---|---|---|---|",
                  f"| {o['eval_triples']} | {o['triples_in_train']:.3f} | {o['target_mentions']} | "
                  f"{o['targets_in_train']:.3f} | {o['named_targets_in_train']:.3f} |", ""]
    if diagnostics:
        g = diagnostics.get("mw_against_gold", {})
        if g:
            earlier = [(label, g[key]) for key, label in (("before_grounding", "everything the model wrote"),
                                                           ("before_confidence", "grounded, before the confidence check"))
                       if key in g]
            names = diagnostics.get("mw_names_in_eval_text", {}).get("fraction", float("nan"))
            lines += ["**Memory-write model against the gold triples** of the evaluation documents"
                      + (" (the first row: the memory after the write checks)" if earlier else ""),
                      "", "| written (unique) | gold | correct | precision | recall | F1 | written names found in the text |",
                      "|---|---|---|---|---|---|---|",
                      f"| {g['written_unique']} | {g['gold_unique']} | {g['correct']} | {g['precision']:.3f} | "
                      f"{g['recall']:.3f} | {g['f1']:.3f} | {names:.3f} |"]
            taught = g.get("training_calls")  # the ceiling: what the documents' own training calls score
            ceiling_row = [("the documents' own training calls (what a writer that learned its examples exactly "
                            "writes)", taught)] if taught else []
            lines += [f"| {raw['written_unique']}: {label} | {raw['gold_unique']} | {raw['correct']} | "
                      f"{raw['precision']:.3f} | {raw['recall']:.3f} | {raw['f1']:.3f} | – |"
                      for label, raw in earlier + ceiling_row]
            by_entity = g.get("entity_level")
            if by_entity:
                ceiling = taught.get("entity_level") if taught else None
                lines += ["", "Counted by entity (a written name may be any full mention of the gold entity; recall "
                          "over the gold relations, `eval.write_quality.entity_agreement`): precision "
                          f"**{by_entity['precision']:.3f}**, recall **{by_entity['recall']:.3f}**, F1 "
                          f"{by_entity['f1']:.3f} ({by_entity['correct']} of {by_entity['written_unique']} written "
                          f"right; {by_entity['gold_relations_found']} of {by_entity['gold_relations']} gold relations found)"
                          + (f"; the training calls {ceiling['precision']:.3f} / {ceiling['recall']:.3f}" if ceiling else "")]
            groups = g.get("by_relation_frequency")
            if groups:
                span = lambda r: f"{r['taught_min']}+" if r["taught_max"] is None else f"{r['taught_min']}-{r['taught_max']}"  # noqa: E731
                lines += ["", "By how often the training memory-write examples teach the relation (relations grouped "
                          "into about equal shares of the gold triples, `eval.write_quality.agreement_by_relation_frequency`):",
                          "", "| relation taught (targets) | relations | gold | written (unique) | correct | precision | recall |",
                          "|---|---|---|---|---|---|---|"]
                lines += [f"| {span(r)} | {r['relations']} | {r['gold_unique']} | {r['written_unique']} | {r['correct']} | "
                          f"{r['precision']:.3f} | {r['recall']:.3f} |" for r in groups]
            lines.append("")
        chosen = diagnostics.get("mw_threshold")
        if chosen:
            rows = chosen["candidates"]
            lines += [f"**Confidence threshold** chosen on the {chosen['documents']} outside documents (development "
                      f"set; {chosen['rule']}): **{threshold_label(chosen['min_confidence'])}**", "",
                      "| confidence >= | " + " | ".join(threshold_label(r["min_confidence"]) for r in rows) + " |",
                      "|---|" + "---|" * len(rows)]
            lines += [f"| {label} | " + " | ".join(f"{r[key]:.3f}" for r in rows) + " |"
                      for key, label in (("precision", "precision"), ("recall", "recall"), ("f1", "F1"))]
            lines.append("")
        curve = diagnostics.get("mw_curve", [])
        if len(curve) > 1:
            lines += ["**Memory-write learning curve** — the adapter's exports (`mw.export_steps`) writing the same "
                      "evaluation documents", "", "| step | precision | recall | F1 | written (unique) | calls cut by the budget |",
                      "|---|---|---|---|---|---|"]
            lines += [f"| {p['step']} | {p['precision']:.3f} | {p['recall']:.3f} | {p['f1']:.3f} | {p['written_unique']} | "
                      f"{p['no_cut'] if p.get('no_cut') is not None else '-'} of {p['sentences']} |" for p in curve]
            lines.append("")
        lines += ["**Copy probe** — teacher-forced, on the API calls of held-out write / read examples (names never "
                  "seen in training): loss (nats/token) and top-1 accuracy by field, and names reproduced exactly", "",
                  "| model | name loss | name acc. | relation loss | relation acc. | markup loss | names exact |",
                  "|---|---|---|---|---|---|---|"]
        for which in ("mw", "mr"):
            f = diagnostics.get(which)
            if f:
                lines.append(f"| {which.upper()} | {f['name']['loss']:.3f} | {f['name']['accuracy']:.3f} | "
                             f"{f['relation']['loss']:.3f} | {f['relation']['accuracy']:.3f} | {f['markup']['loss']:.3f} | "
                             f"{f['name_exact']:.3f} ({f['names']}) |")
    return "\n".join(lines)


def scaling_markdown(points: Sequence[Mapping], growth: Sequence[Mapping]) -> str:
    lines = ["**Scaling the stored triples** — perplexity as distractor triples are added to the memory", "",
             "| distractors | stored triples | OVERALL | TARGET | ENTITY | reads with target in results |",
             "|---|---|---|---|---|---|"]
    for p in points:
        lines.append(f"| {p['distractors']} | {p['triples']} | {_f(p['ppl'].get('overall'))} | {_f(p['ppl'].get('target'))} | "
                     f"{_f(p['ppl'].get('entity'))} | {p['target_in_results']} |")
    lines += ["", "**Figure 4 analogue** — entity + relation records per stored triple (a one-vector-per-fact store needs 1.0)",
              "", "| triples added | stored | entities | relations | records per triple |", "|---|---|---|---|---|"]
    for g in growth:
        lines.append(f"| {g['added']} | {g['triples']} | {g['entities']} | {g['relations']} | {g['records_per_triple']:.3f} |")
    return "\n".join(lines)


def results_tables(res: str | pathlib.Path) -> list[str]:
    """The markdown tables of a run's results directory in the report's order: diagnostics (held-out check,
    memory-write precision / recall, copy probe), Table 2 and its read diagnostics, each Table 3, scaling, two-hop
    questions. Table 2, 3, scaling and two-hop are the files their stages wrote; then the roofline table (`roofline_table`). Absent results
    are left out. One block per table group (`results/report.md` and RESULTS.md)."""
    res = pathlib.Path(res)

    def load(name):
        return load_json(res / name) if (res / name).exists() else None

    blocks = []
    diag = diagnostics_markdown(load("corpus.json"), load("diagnostics.json"))
    if diag:
        blocks.append(diag)
    for name in ("table2.md", *sorted(p.name for p in res.glob("table3*.md")), "scaling.md", "two_hop.md"):
        if (res / name).exists():
            blocks.append((res / name).read_text())
        if name == "table2.md" and load("table2.json"):
            blocks.append(read_diagnostics_markdown(load("table2.json")))
    if load("roofline.json"):
        blocks.append(table_markdown(load("roofline.json")))
    return blocks


def _savefig(fig, path: pathlib.Path) -> None:
    with atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120, bbox_inches="tight")


def plot_scaling(points: Sequence[Mapping], growth: Sequence[Mapping], path: str | pathlib.Path) -> pathlib.Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = pathlib.Path(path)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    if points:
        xs = [p["triples"] for p in points]
        for key in ("target", "entity", "overall"):
            a.plot(xs, [p["ppl"].get(key, float("nan")) for p in points], marker="o", label=key.upper())
        a.set_xscale("symlog")
        a.legend()
    a.set_xlabel("triples in memory")
    a.set_ylabel("perplexity")
    a.set_title("Perplexity vs memory size")
    if growth:
        xs = [g["triples"] for g in growth]
        b.plot(xs, [g["records_per_triple"] for g in growth], marker="o", label="MemLLM: entity+relation records / triple")
        b.plot(xs, [1.0] * len(xs), linestyle="--", label="one vector per fact")
        b.set_xscale("log")
        b.legend()
    b.set_xlabel("stored triples")
    b.set_ylabel("fraction of vectors vs one-per-fact")
    b.set_title("Figure 4 analogue: memory efficiency")
    _savefig(fig, path)
    plt.close(fig)
    return path


def plot_table2(results: Mapping[str, Mapping], path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    fig = table2_figure(results)  # selects the Agg backend before pyplot is imported here
    import matplotlib.pyplot as plt

    _savefig(fig, path)
    plt.close(fig)
    return path


def table2_figure(results: Mapping[str, Mapping]):
    """The Table 2 bar chart (a matplotlib figure): OVERALL / TARGET / ENTITY per row, on a log axis when they
    span more than a factor of 20."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in ROWS if k in results]
    # one inch per row and the legend beside the axes: a row's label ("Baseline" over "#1", one word a line) fits
    # under its own bars and the legend covers none
    fig, ax = plt.subplots(figsize=(max(4.0, 1.0 * len(keys)) + 1.5, 4))
    width = 0.27
    for i, metric in enumerate(("overall", "target", "entity")):
        ax.bar([x + (i - 1) * width for x in range(len(keys))], [results[k]["ppl"].get(metric, float("nan")) for k in keys],
               width, label=metric.upper())
    ax.set_xticks(range(len(keys)), ["\n".join(ROWS[k].name.split()) for k in keys])
    from memllm_jax.eval.html import needs_log

    log = needs_log([v for k in keys for v in results[k]["ppl"].values()])
    if log:  # TARGET perplexities span 1 to 500: on a linear axis the memory rows are invisible
        ax.set_yscale("log")
    ax.set_ylabel("perplexity (log scale)" if log else "perplexity")
    ax.set_title("Table 2 rows (ours)")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig
