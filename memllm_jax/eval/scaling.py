"""Scaling the stored triples (paper §4.2, "Scaling the stored triples" and Figure 4).

1. TARGET (and OVERALL / ENTITY) perplexity as the memory grows: the evaluation memory (the evaluation
   documents' triples) plus an increasing number of distractor triples taken from other documents.
2. Figure 4's redundancy ratio as triples are added: the entity + relation records the memory embeds and
   indexes per stored triple, against a one-vector-per-fact store (a proposition RAG), whose ratio is 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from memllm_jax import protocol
from memllm_jax.eval.perplexity import ReadSetting, evaluate_perplexity, read_scorer
from memllm_jax.eval.records import EncodedDoc
from memllm_jax.eval.scoring import ModelWork


@dataclasses.dataclass
class ScalingPoint:
    distractors: int
    triples: int
    entities: int
    relations: int
    ppl: dict[str, float]
    reads_with_results: int
    target_in_results: int


def memory_growth(encoder: Any, triples: Sequence[protocol.Triple], checkpoints: Sequence[int], memory_config=None,
                  batch: int = 2048) -> list[dict]:
    """Figure 4: memory statistics after adding the first n triples, for each n in `checkpoints`."""
    from memllm_jax.memory import TripleMemory

    mem = TripleMemory(encoder, memory_config)
    out, added = [], 0
    for n in sorted(set(min(int(c), len(triples)) for c in checkpoints)):
        while added < n:
            step = min(batch, n - added)
            mem.add(list(triples[added:added + step]), source="scaling")
            added += step
        s = mem.stats()
        stored = s["triples"]
        out.append({"added": n, "triples": stored, "entities": s["entities"], "relations": s["relations"],
                    "records_per_triple": s["records_per_triple"], "one_vector_per_fact": 1.0 if stored else 0.0})
    return out


def perplexity_vs_memory_size(model: Any, tok: Any, docs: Sequence[EncodedDoc], encoder: Any,
                              base_triples: Sequence[protocol.Triple], distractors: Sequence[protocol.Triple],
                              sizes: Sequence[int], setting: ReadSetting, *, memory_config=None, batch_size: int = 8,
                              progress: Callable[[str], None] | None = None,
                              work: ModelWork | None = None) -> list[ScalingPoint]:
    """Perplexities with the memory holding `base_triples` + the first k `distractors`, for k in `sizes`; `work`,
    if given, adds up what the evaluations ran through the model."""
    from memllm_jax.memory import TripleMemory

    mem = TripleMemory(encoder, memory_config)
    mem.add(list(base_triples), source="eval")
    scorer = read_scorer(model, tok, batch_size)
    points, added = [], 0
    for k in sorted(set(min(int(s), len(distractors)) for s in sizes)):
        if k > added:
            mem.add(list(distractors[added:k]), source="distractor")
            added = k
        res = evaluate_perplexity(model, tok, docs, mem, setting, batch_size=batch_size, scorer=scorer)
        if work is not None:
            work += res.work
        st = mem.stats()
        points.append(ScalingPoint(k, st["triples"], st["entities"], st["relations"], res.ppl,
                                   res.stats["reads_with_results"], res.stats["target_in_results"]))
        if progress:
            progress(f"  scaling: +{k} distractors ({st['triples']} triples): TARGET PPL {res.ppl['target']:.3f}")
    return points
