"""The loss mask: exactly the span tokens count, and tokens outside the spans get zero gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memllm_jax.train import data as D
from memllm_jax.train.loss import masked_cross_entropy
from tests.support.train_fixtures import make_tokenizer, write_jsonl, write_records


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.mark.slow
def test_loss_counts_span_tokens_and_ignores_the_rest(tok, tmp_path):
    records = write_records(8, seed=4)
    corpus = D.load_corpus([write_jsonl(tmp_path / "w.jsonl", records)], tok, seq_len=128)
    planner = D.Planner(corpus, seq_len=128, global_batch=8, packing="pad", seed=0, shuffle=False)
    batch = D.materialize(planner.plan(0), corpus, pad_id=tok.pad_id, micro_batches=1)
    batch = {k: v[0] for k, v in batch.items()}
    # expected count from the records themselves: tokens of the loss segments, plus EOS
    expected = sum(len(tok.encode(s["text"])) for r in records for s in r["segments"] if s["loss"]) + len(records)
    B, L = batch["targets"].shape
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(B, L, tok.vocab_size)), jnp.float32)

    def loss(lg, targets):
        total, n = masked_cross_entropy(lg, targets, batch["loss_mask"])
        return total / n, n

    (value, n), grad = jax.value_and_grad(loss, has_aux=True)(logits, batch["targets"])
    assert int(n) == expected == int(batch["loss_mask"].sum())
    outside = ~batch["loss_mask"]
    assert outside.any()
    assert float(jnp.abs(grad[outside]).max()) == 0.0
    assert float(jnp.abs(grad[batch["loss_mask"]]).max()) > 0
    # other tokens outside the spans: same loss, same (zero) gradients there
    rng = np.random.default_rng(0)
    changed = np.where(outside, rng.integers(0, tok.vocab_size, batch["targets"].shape), batch["targets"])
    assert (changed != batch["targets"]).any()
    (value2, _), grad2 = jax.value_and_grad(loss, has_aux=True)(logits, changed)
    assert float(value2) == float(value)
    assert np.array_equal(np.asarray(grad2), np.asarray(grad))
    # reference: mean of -log softmax at the span targets
    logp = jax.nn.log_softmax(logits, -1)
    ref = -np.take_along_axis(np.asarray(logp), batch["targets"][..., None], -1)[..., 0][batch["loss_mask"]].mean()
    assert abs(float(value) - ref) < 1e-5
