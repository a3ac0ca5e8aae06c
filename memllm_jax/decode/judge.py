"""A judge of written triples: a model (the base with a judge adapter, `data_gen.judge_examples`) that reads the
text up to a sentence and one triple written from it, and answers `protocol.JUDGE_ANSWERS` (" yes" / " no").

Its score of a triple is the log-odds log p(" yes") - log p(" no") after `protocol.format_judge_prompt`. The memory
stage uses it in place of the memory-write model's own confidence (`decode.writer.item_confidences`): a writer
trained to produce calls is sure of many triples its sentence does not state (reversed, another relation, another
entity of the sentence), which a model trained to tell them apart can reject.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np
from flax import nnx

from memllm_jax import protocol
from memllm_jax.decode.corpus_writer import as_write_document
from memllm_jax.eval.scoring import Scorer


class TripleJudge:
    """`log_odds(contexts, triples)`: the judge's score of each (context, triple).

    The candidates of one sentence share its context: each distinct context is encoded once, its keys / values
    kept (`eval.scoring.Scorer`), and every candidate's fact and question are scored after them (a Re-DocRED
    context is ~150 SmolLM2 tokens, a fact with the question ~30). The Scorer reports log p of one chosen token at
    every position (`mr_id`, the read marker in Table 2): here the answer " no", while the candidate's sequence
    ends with " yes", so log-odds = log p(" yes") - log p(" no") at the last position."""

    def __init__(self, model: nnx.Module, tokenizer, batch_size: int = 8):
        answers = [tokenizer.encode(a) for a in protocol.JUDGE_ANSWERS]
        if any(len(a) != 1 for a in answers):
            raise ValueError(f"the judge's answers {protocol.JUDGE_ANSWERS} must be one token each, got {answers}")
        self.tokenizer, (self.yes,), (no,) = tokenizer, *answers
        self.scorer = Scorer(model, no, batch_size=batch_size, pad_id=tokenizer.pad_id)

    def log_odds(self, contexts: Sequence[str], triples: Sequence[protocol.Triple]) -> np.ndarray:
        tok = self.tokenizer
        seqs = [[tok.bos_id] + tok.encode(protocol.format_judge_prompt(c, t)) + [self.yes]
                for c, t in zip(contexts, triples, strict=True)]
        heads = {c: [tok.bos_id] + tok.encode(protocol.escape_text(c)) for c in dict.fromkeys(contexts)}
        # a candidate shares its context's keys / values when its tokens start with the context's own tokens (BPE
        # may merge across the boundary: then it is scored whole); the kept sequence reaches one token past it
        shared = [seq[:len(heads[c])] == heads[c] for c, seq in zip(contexts, seqs)]
        kept_of = {}
        for c, seq, ok in zip(contexts, seqs, shared):
            if ok:
                kept_of.setdefault(c, seq[:len(heads[c]) + 1])
        if not self.scorer.keeps_kv:
            shared, kept_of = [False] * len(seqs), {}
        kept = dict(zip(kept_of, self.scorer.score(list(kept_of.values()), keep_kv=True)))
        items = [(kept[c], len(heads[c]), seq[len(heads[c]):]) for c, seq, ok in zip(contexts, seqs, shared) if ok]
        after = iter(self.scorer.score_continuations(items) if items else [])
        whole = iter(self.scorer.score([seq for seq, ok in zip(seqs, shared) if not ok]))
        out = [next(after) if ok else next(whole) for ok in shared]
        return np.asarray([s.lp_next[-1] - s.lp_mr[-1] for s in out], np.float64)


def judge_context(doc, sent_id: int, pretext_sentences: int = 10) -> str:
    """The text the judge reads for a triple written from sentence `sent_id`: the sentence and the up-to-
    `pretext_sentences` sentences before it, as the memory-write prompt has them (`corpus_writer.iter_write_prompts`)."""
    first = max(0, sent_id - pretext_sentences)
    return doc.text[doc.sentences[first][0]:doc.sentences[sent_id][1]]


def judge_scored(judge: TripleJudge, documents: Iterable[Any], scored: Sequence[tuple[str, protocol.Triple, float]],
                 pretext_sentences: int = 10) -> list[tuple[str, protocol.Triple, float]]:
    """`WriteStats.scored` (source `doc_id/sentence`, triple, the writer's confidence) with each confidence replaced
    by the judge's log-odds; `documents` are those written (any form `as_write_document` takes)."""
    docs = {d.doc_id: d for d in (as_write_document(raw, k) for k, raw in enumerate(documents))}
    contexts = []
    for source, _, _ in scored:
        doc_id, sent = source.rsplit("/", 1)
        contexts.append(judge_context(docs[doc_id], int(sent), pretext_sentences))
    scores = judge.log_odds(contexts, [t for _, t, _ in scored]) if scored else []
    return [(source, t, float(s)) for (source, t, _), s in zip(scored, scores)]
