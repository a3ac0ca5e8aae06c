"""The paper's mixture formula and span perplexities against a hand-computed example."""

import math

import numpy as np
import pytest

from memllm_jax.eval.mixture import (SpanNLL, char_spans_to_token_mask, char_to_token_index, corpus_perplexities,
                                     mix_logprobs, span_nll)


def test_mixture_hand_computed():
    # Four text tokens; reads at tokens 1 and 3.
    p_path = np.array([0.5, 0.2, 0.1, 0.4])
    p_read = np.array([0.0, 0.8, 0.0, 0.6])
    p_mr = np.array([0.9, 0.25, 0.9, 0.5])  # only used at read positions
    read = np.array([False, True, False, True])
    logp = mix_logprobs(np.log(p_path), np.log(np.maximum(p_read, 1e-300)), np.log(p_mr), read)
    # token 1: 0.8 * 0.25 + 0.2 * 0.75 = 0.35; token 3: 0.6 * 0.5 + 0.4 * 0.5 = 0.5
    np.testing.assert_allclose(np.exp(logp), [0.5, 0.35, 0.1, 0.5], rtol=1e-12)


def test_mixture_edge_cases():
    # p(MR) = 1 gives the read branch; p(MR) ~ 0 gives the path branch; -inf read branch is fine.
    logp = mix_logprobs(np.log([0.3, 0.3]), np.log([0.9, 0.9]), np.array([0.0, -1e30]), np.array([True, True]))
    np.testing.assert_allclose(np.exp(logp), [0.9, 0.3], rtol=1e-12)
    logp = mix_logprobs(np.log([0.3]), np.array([-np.inf]), np.log([0.5]), np.array([True]))
    np.testing.assert_allclose(np.exp(logp), [0.15], rtol=1e-12)


def test_span_perplexities_hand_computed():
    # text "Ann met Bob" tokenised as "Ann", " met", " Bob"; entity mentions Ann [0,3) and Bob [8,11); target Bob.
    offsets = [(0, 3), (3, 7), (7, 11)]
    entity = char_spans_to_token_mask(offsets, [(0, 3), (8, 11)])
    target = char_spans_to_token_mask(offsets, [(8, 11)])
    assert entity.tolist() == [True, False, True] and target.tolist() == [False, False, True]
    probs = np.array([0.5, 0.25, 0.8])
    doc = span_nll(np.log(probs), {"overall": np.ones(3, bool), "target": target, "entity": entity})
    ppl = doc.perplexities()
    assert ppl["overall"] == pytest.approx((0.5 * 0.25 * 0.8) ** (-1 / 3))
    assert ppl["target"] == pytest.approx(1 / 0.8)
    assert ppl["entity"] == pytest.approx((0.5 * 0.8) ** (-1 / 2))
    # Corpus level: token weighted over documents, not a mean of document perplexities.
    other = span_nll(np.log([0.1]), {"overall": np.ones(1, bool), "target": np.ones(1, bool), "entity": np.zeros(1, bool)})
    corpus = corpus_perplexities([doc, other])
    assert corpus["overall"] == pytest.approx((0.5 * 0.25 * 0.8 * 0.1) ** (-1 / 4))
    assert corpus["target"] == pytest.approx((0.8 * 0.1) ** (-1 / 2))
    assert corpus["entity"] == pytest.approx((0.5 * 0.8) ** (-1 / 2))
    assert math.isnan(SpanNLL({"x": 0.0}, {"x": 0}).perplexities()["x"])


def test_char_to_token_index():
    offsets = [(0, 3), (3, 7), (7, 11)]
    assert char_to_token_index(offsets, 0) == 0
    assert char_to_token_index(offsets, 8) == 2  # the read goes before " Bob", the token holding "B"
    assert char_to_token_index(offsets, 11) == 3


def test_mask_shape_mismatch_names_the_mask():
    with pytest.raises(ValueError, match="target"):
        span_nll(np.zeros(3), {"target": np.zeros(2, bool)})
