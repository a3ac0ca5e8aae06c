"""The nnx BERT encoder against sentence-transformers on the shipped all-MiniLM-L6-v2 weights."""

import numpy as np
import pytest

from memllm_jax.memory import HashEncoder, load_encoder
from memllm_jax.memory.encoder import minilm_path

NAMES = [
    "Barack Obama", "place of birth", "Honolulu", "a", "U.S.", "the United States of America",
    "Zürich ☃ 東京", "country of citizenship", "Mistral 7B", "  spaced  out  ",
    "a very long entity name that keeps going " * 12,  # longer than one length bucket
]


@pytest.fixture(scope="module")
def minilm():
    return load_encoder("minilm")


@pytest.mark.slow
def test_parity_with_sentence_transformers(minilm):
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(str(minilm_path()), device="cpu").encode(NAMES, convert_to_numpy=True, batch_size=4)
    ours = minilm.encode(NAMES)
    assert ours.dtype == np.float32 and ours.shape == (len(NAMES), minilm.dim) == (len(NAMES), 384)
    assert np.abs(ours - ref).max() <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    # batching and padding buckets do not change an embedding
    np.testing.assert_allclose(minilm.encode(NAMES[:1])[0], ours[0], atol=1e-6)


def test_bucketed_jit_does_not_recompile_per_batch(minilm):
    minilm.encode(["warm up"])
    before = minilm._forward._cache_size()
    for n in (1, 2, 3):
        minilm.encode([f"name {i}" for i in range(n)])  # all in the (4, 16) bucket
    assert minilm._forward._cache_size() - before <= 1


def test_hash_encoder_is_deterministic_unit_norm():
    a, b = HashEncoder(32).encode(["x", "y", "x"]), HashEncoder(32).encode(["x"])
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[0], a[2])
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    assert not np.allclose(a[0], a[1])
