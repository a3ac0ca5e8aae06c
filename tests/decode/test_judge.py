"""The triple judge (`decode.judge`): its log-odds are the model's own last-position logits, in any batch; the
memory stage's rescoring keeps exactly the triples the judge passes; the AUC that reports it."""

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax import protocol as P
from memllm_jax.config import TINY
from memllm_jax.decode.corpus_writer import WriteStats, write_rescored
from memllm_jax.decode.judge import TripleJudge, judge_context, judge_scored
from memllm_jax.eval.write_quality import scored_auc
from memllm_jax.memory import TripleMemory, load_encoder
from memllm_jax.model.mistral import Mistral
from tests.support.eval_fakes import CharTokenizer

CFG = dataclasses.replace(TINY, vocab_size=128, max_seq_len=256)
YES, NO = 110, 111


class AnswerTokenizer(CharTokenizer):
    """The character tokenizer with the judge's answers as single tokens."""

    def encode(self, text: str) -> list[int]:
        return {P.JUDGE_ANSWERS[0]: [YES], P.JUDGE_ANSWERS[1]: [NO]}.get(text) or super().encode(text)


DOC = ("d1", ["Ann was born in Paris.", "She wrote Blue Sky.", "Bob met Ann in Rome."])


class EndMergingTokenizer(AnswerTokenizer):
    """Spells a text's final "Z" as another token: a context ending so is not a token prefix of its prompts."""

    def encode(self, text: str) -> list[int]:
        ids = super().encode(text)
        return ids[:-1] + [112] if text.endswith("Z") else ids


@pytest.mark.slow
@pytest.mark.parametrize("tok", [AnswerTokenizer(), EndMergingTokenizer()], ids=["shared", "merged"])
def test_log_odds_are_the_models_last_position_logits_in_any_batch(tok):
    """Candidates after a shared context (its keys / values kept once) or, when the tokens at the context's end
    merge, scored whole: either way the model's own logits of the whole prompt, in the input's order."""
    model = Mistral(CFG, rngs=nnx.Rngs(3))
    long = "Ann was born in Paris. She wrote Blue Sky, a long book about the sea, Z"
    contexts = ["Ann was born in Paris.", long, "xZ", long]
    triples = [P.Triple("Ann", "place of birth", "Paris"), P.Triple("Ann", "notable work", "Blue Sky"),
               P.Triple("x", "r", "y"), P.Triple("Blue Sky", "author", "Ann")]
    got = TripleJudge(model, tok, batch_size=2).log_odds(contexts, triples)
    for c, t, g in zip(contexts, triples, got):
        ids = [tok.bos_id] + tok.encode(P.format_judge_prompt(c, t))
        logits, _ = model(jnp.asarray([ids]), jnp.arange(len(ids))[None])
        np.testing.assert_allclose(g, float(logits[0, -1, YES] - logits[0, -1, NO]), atol=1e-4)
    with pytest.raises(ValueError, match="one token"):
        TripleJudge(model, CharTokenizer())


def test_judge_scored_reads_each_triples_sentence_with_the_writers_pretext():
    class Recorder:
        def log_odds(self, contexts, triples):
            self.contexts = list(contexts)
            return np.arange(len(triples), dtype=float)

    judge = Recorder()
    t = P.Triple("Bob", "met", "Ann")
    out = judge_scored(judge, [DOC], [("d1/2", t, -0.1), ("d1/0", t, -0.2)], pretext_sentences=1)
    assert out == [("d1/2", t, 0.0), ("d1/0", t, 1.0)]
    assert judge.contexts == ["She wrote Blue Sky. Bob met Ann in Rome.", "Ann was born in Paris."]
    from memllm_jax.decode.corpus_writer import as_write_document
    assert judge_context(as_write_document(DOC), 2, 10) == "Ann was born in Paris. She wrote Blue Sky. Bob met Ann in Rome."


def test_write_rescored_keeps_what_passes_and_marks_the_rest_unconfident():
    a, b, c = P.Triple("Ann", "born in", "Paris"), P.Triple("Paris", "born in", "Ann"), P.Triple("Ann", "wrote", "Sky")
    stats = WriteStats(sentences=2, scored=[("d/0", a, -0.1), ("d/0", b, -0.2)],
                       written=[("d/0", a, "kept"), ("d/0", b, "kept"), ("d/1", c, "ungrounded")], ungrounded=[c])
    mem = TripleMemory(load_encoder("hash:32"))
    out = write_rescored(mem, stats, [("d/0", a, 2.5), ("d/0", b, -3.0)], min_confidence=0.0)
    assert [(r["subject"], r["object"]) for r in mem.records()] == [("Ann", "Paris")]
    assert out.triples == 1 and out.unconfident == [b] and out.ungrounded == [c] and out.sentences == 2
    assert out.written == [("d/0", a, "kept"), ("d/0", b, "unconfident"), ("d/1", c, "ungrounded")]
    assert out.scored == [("d/0", a, 2.5), ("d/0", b, -3.0)]


def test_scored_auc():
    g1, g2, w1, w2 = (P.Triple(f"s{i}", "r", "o") for i in range(4))
    assert scored_auc([("x", g1, 3.0), ("x", w1, 1.0), ("x", g2, 2.0), ("x", w2, 0.0)], [g1, g2]) == 1.0
    assert scored_auc([("x", g1, 0.0), ("x", w1, 1.0)], [g1]) == 0.0
    assert scored_auc([("x", g1, 1.0), ("x", w1, 1.0), ("y", g1, -5.0)], [g1]) == 0.5  # a tie; a triple at its best
    assert scored_auc([("x", g1, 1.0)], [g1]) is None
