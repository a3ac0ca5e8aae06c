"""The statistics report printed by `memllm data build` / `synth` / `filter`."""

from __future__ import annotations

import dataclasses
import math


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


@dataclasses.dataclass
class Stats:
    documents: int = 0
    write_examples: int = 0
    empty_writes: int = 0
    triples_per_sentence: list = dataclasses.field(default_factory=list)
    read_examples: int = 0
    context_free_reads: int = 0
    """Of `read_examples`: reads of a lone later sentence (`read_examples.context_free_records`)."""
    question_form_reads: int = 0
    """Of `read_examples`: reads after a question (`read_examples.question_form_records`)."""
    absent_reads: int = 0
    """Of `read_examples`: questions whose read finds nothing, answered `protocol.ABSTAIN`
    (`read_examples.absent_question_records`)."""
    two_hop_reads: int = 0
    """Two-hop questions answered by two reads (`two_hop.two_hop_records`; two of `read_examples` each)."""
    reads_per_doc: list = dataclasses.field(default_factory=list)
    queries_per_read: list = dataclasses.field(default_factory=list)
    results_per_query: list = dataclasses.field(default_factory=list)
    target_fallbacks: int = 0
    misread_results: int = 0
    """Query results of the read examples (the documents' own and the context-free ones) replaced by a wrong
    entity (`read_examples.misread`)."""
    dropped_ambiguous: int = 0
    dropped_too_many: int = 0
    eval_records: int = 0
    eval_reads: int = 0
    entity_mentions: int = 0
    gold_relations: int = 0
    relations_not_written: dict = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def add_write(self, record: dict) -> None:
        self.write_examples += 1
        n = len(record["triples"])
        self.triples_per_sentence.append(n)
        self.empty_writes += n == 0

    def add_read_points(self, points) -> None:
        self.reads_per_doc.append(len(points))
        for pt in points:
            self.read_examples += 1
            self.queries_per_read.append(len(pt.queries))
            self.results_per_query.extend(len(r) for r in pt.results)
            self.target_fallbacks += not pt.merged_results
            self.dropped_ambiguous += pt.dropped_ambiguous
            self.dropped_too_many += pt.dropped_too_many

    def add_eval(self, record: dict) -> None:
        self.eval_records += 1
        self.eval_reads += len(record["reads"])
        self.entity_mentions += len(record["entity_mentions"])

    def add_coverage(self, coverage: list[dict]) -> None:
        self.gold_relations += len(coverage)
        for c in coverage:
            if not c["sentences"]:
                key = ("its triple text equals another written relation's (entities sharing a mention)"
                       if "triple text" in c["reason"] else c["reason"])
                self.relations_not_written[key] = self.relations_not_written.get(key, 0) + 1

    def rows(self) -> list[tuple[str, str]]:
        tps, rpd, qpr, rpq = self.triples_per_sentence, self.reads_per_doc, self.queries_per_read, self.results_per_query
        rows = [("documents", f"{self.documents}")]
        if self.write_examples:
            rows += [
                ("write examples (sentences)", f"{self.write_examples} ({self.empty_writes} empty)"),
                ("triples per sentence: mean / p95 / max", f"{_mean(tps):.2f} / {_pct(tps, .95):.1f} / {max(tps)}"),
                ("gold relations: written / total", f"{self.gold_relations - sum(self.relations_not_written.values())} / {self.gold_relations}"),
            ]
            rows += [(f"  not written: {k}", str(v)) for k, v in sorted(self.relations_not_written.items())]
        if self.reads_per_doc:
            rows += [
                ("read examples (of them context-free / question-form)",
                 f"{self.read_examples} ({self.context_free_reads} / {self.question_form_reads})"),
                *([("  of them absent-fact questions", str(self.absent_reads))] if self.absent_reads else []),
                *([("  of them two-hop questions (two examples each)", str(self.two_hop_reads))] if self.two_hop_reads else []),
                ("read points per document: mean / p95 / max", f"{_mean(rpd):.2f} / {_pct(rpd, .95):.1f} / {max(rpd)}"),
                ("queries per read: mean / max", f"{_mean(qpr):.2f} / {max(qpr, default=0)}"),
                ("results per query: mean / p95 / max", f"{_mean(rpq):.2f} / {_pct(rpq, .95):.1f} / {max(rpq, default=0)}"),
                ("reads answered by the target (empty results)", f"{self.target_fallbacks}"),
                ("query results replaced by a wrong entity (misread)", f"{self.misread_results}"),
                ("queries dropped: ambiguous (Table 4) / > Q_thr", f"{self.dropped_ambiguous} / {self.dropped_too_many}"),
            ]
        if self.eval_records:
            rows += [("eval records / gold reads / entity mentions", f"{self.eval_records} / {self.eval_reads} / {self.entity_mentions}")]
        rows.append(("seconds", f"{self.seconds:.2f}"))
        return rows

    def report(self, title: str = "statistics") -> str:
        rows = self.rows()
        lines = [f"## {title}", "", "| statistic | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in rows]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if not isinstance(v, list)} | {
            "triples_per_sentence_p95": _pct(self.triples_per_sentence, 0.95),
            "reads_per_doc_mean": _mean(self.reads_per_doc),
            "queries_per_read_mean": _mean(self.queries_per_read),
            "results_per_query_mean": _mean(self.results_per_query),
        }
