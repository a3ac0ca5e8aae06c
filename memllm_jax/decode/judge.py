"""A judge of written triples: a model (the base with a judge adapter, `data_gen.judge_examples`) that reads the
text up to a sentence and one triple written from it, and answers `protocol.JUDGE_ANSWERS` (" yes" / " no").

Its score of a triple is the log-odds log p(" yes") - log p(" no") after `protocol.format_judge_prompt`. The memory
stage uses it in place of the memory-write model's own confidence (`decode.writer.item_confidences`): a writer
trained to produce calls is sure of many triples its sentence does not state (reversed, another relation, another
entity of the sentence), which a model trained to tell them apart can reject.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from memllm_jax import protocol
from memllm_jax.decode.corpus_writer import as_write_document
from memllm_jax.eval.scoring import _bucket, batches_by_length


class TripleJudge:
    """`log_odds(contexts, triples)`: the judge's score of each (context, triple), batched by length."""

    def __init__(self, model: nnx.Module, tokenizer, batch_size: int = 8):
        self.tokenizer, self.batch_size = tokenizer, int(batch_size)
        answers = [tokenizer.encode(a) for a in protocol.JUDGE_ANSWERS]
        if any(len(a) != 1 for a in answers):
            raise ValueError(f"the judge's answers {protocol.JUDGE_ANSWERS} must be one token each, got {answers}")
        yes, no = answers[0][0], answers[1][0]
        graphdef, self.state = nnx.split(model)
        cfg = getattr(model, "cfg", None)
        self.max_len = int(cfg.max_seq_len) if cfg is not None else 1 << 16

        def log_odds(state, tokens_BxL, mask_BxL, last_B):
            m = nnx.merge(graphdef, state)
            positions_BxL = jnp.broadcast_to(jnp.arange(tokens_BxL.shape[1], dtype=jnp.int32), tokens_BxL.shape)
            logits_BxLxV, _ = m(tokens_BxL, positions_BxL, attn_mask_BxL=mask_BxL)
            last_BxV = jnp.take_along_axis(logits_BxLxV, last_B[:, None, None], axis=1)[:, 0]
            return (last_BxV[:, yes] - last_BxV[:, no]).astype(jnp.float32)  # the softmax's normaliser cancels

        self._log_odds = jax.jit(log_odds)

    def log_odds(self, contexts: Sequence[str], triples: Sequence[protocol.Triple]) -> np.ndarray:
        seqs = [[self.tokenizer.bos_id] + self.tokenizer.encode(protocol.format_judge_prompt(c, t))
                for c, t in zip(contexts, triples, strict=True)]
        out = np.zeros(len(seqs), np.float64)
        for batch in batches_by_length([len(s) for s in seqs], self.batch_size):
            chunk = [seqs[i][-self.max_len:] for i in batch]  # an over-long context loses its start
            L = min(_bucket(max(len(s) for s in chunk)), self.max_len)
            tokens = np.full((self.batch_size, L), self.tokenizer.pad_id, np.int32)
            mask = np.zeros((self.batch_size, L), bool)
            last = np.zeros(self.batch_size, np.int32)
            for b, s in enumerate(chunk):
                tokens[b, :len(s)], mask[b, :len(s)], last[b] = s, True, len(s) - 1
            scores = jax.device_get(self._log_odds(self.state, jnp.asarray(tokens), jnp.asarray(mask), jnp.asarray(last)))
            out[batch] = scores[:len(chunk)]
        return out


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
