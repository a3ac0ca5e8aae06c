"""Evaluation records for Table 2 (kind "eval"), one per document; the format is documented in docs/data.md.

All character offsets index the record's `text`, which is the document's plain text already escaped with
`protocol.escape_text` (so it can be tokenized next to API calls without ever producing a marker id).
"""

from __future__ import annotations

from data_gen.docred import Document
from data_gen.gold_memory import gold_triples
from data_gen.read_examples import MAX_QUERIES, scan_read_points
from memllm_jax import protocol as P


def eval_record(doc: Document, max_queries: int = MAX_QUERIES, filter_ambiguous: bool = True) -> dict:
    text, off = P.escape_text_with_offsets(doc.text)

    def span(s: tuple[int, int]) -> list[int]:
        return [off[s[0]], off[s[1]]]

    mentions = [
        {"span": span(m.span), "entity": m.entity, "text": m.text, "pronoun": m.is_pronoun}
        for m in doc.mentions_in_order()
    ]
    reads = []
    for pt in scan_read_points(doc, None, max_queries=max_queries, filter_ambiguous=filter_ambiguous):
        reads.append({
            "pos": off[pt.pos],
            "queries": [[q.subject, q.relation, q.object] for q in pt.queries],
            "targets": [{"name": m.text, "span": span(m.span), "entity": m.entity} for m in pt.targets],
        })
    return {
        "kind": "eval",
        "doc": doc.doc_id,
        "title": doc.title,
        "text": text,
        "sentences": [span(s) for s in doc.sentences],
        "entity_mentions": mentions,
        "reads": reads,
        "triples": [[t.subject, t.relation, t.object] for t in gold_triples(doc)],
        "entity_names": [e.name for e in doc.entities],
    }
