"""`ModelConfig.attention="splash"` (`memllm_jax/model/splash.py`): the Pallas splash-attention kernel, run
here in Pallas interpret mode ("splash_interpret": no TPU on this machine), gives the reference einsum path's
logits and LoRA gradients - causal with grouped-query heads, a sliding window, padded rows, packed segments,
a sequence over several kernel blocks, and per device under a mesh. "splash" itself refuses to run off TPU,
and forwards on a KV cache keep the reference path."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memllm_jax.config import LoraConfig, MeshConfig, ModelConfig
from memllm_jax.model.decoder import Decoder, init_cache
from memllm_jax.sharding import batch_sharding, make_mesh, state_shardings
from memllm_jax.train.loss import masked_cross_entropy

CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64,
                  sliding_window=None, max_seq_len=512, scan_layers=True)
LORA = LoraConfig(rank=4, dropout=0.0)


def _models(cfg: ModelConfig, attention: str):
    ref = Decoder(cfg, LORA, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(1)
    for _, var in nnx.to_flat_state(nnx.state(ref, nnx.LoRAParam)):
        var[...] = jnp.asarray(0.2 * rng.standard_normal(var[...].shape), jnp.float32)
    other = Decoder(dataclasses.replace(cfg, attention=attention), LORA, rngs=nnx.Rngs(0))
    nnx.update(other, nnx.state(ref))
    return ref, other


def _batch(B: int, L: int, pieces: tuple[int, ...] | None, pad_rows: dict[int, tuple[int, int]]):
    """Tokens, positions (from 0 in every piece), attention mask (row r padded at `slice(*pad_rows[r])`) and
    segment ids (1, 2, ... per piece; None when `pieces` is None)."""
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (B, L)), jnp.int32)
    pieces = pieces or (L,)
    positions = np.concatenate([np.arange(n) for n in pieces])[None].repeat(B, 0)
    segments = np.repeat(np.arange(1, len(pieces) + 1), pieces)[None].repeat(B, 0)
    mask = np.ones((B, L), bool)
    for r, (start, stop) in pad_rows.items():
        mask[r, start:stop] = False
        segments[r, start:stop] = 0
    seg = None if len(pieces) == 1 else jnp.asarray(segments, jnp.int32)
    return tokens, jnp.asarray(positions, jnp.int32), jnp.asarray(mask), seg


def _logits_and_grads(model, tokens, positions, mask, segments, shardings=None):
    graphdef, params, rest = nnx.split(model, nnx.LoRAParam, ...)
    targets = jnp.roll(tokens, -1, axis=1)

    def loss(params, rest):
        m = nnx.merge(graphdef, params, rest, copy=True)
        logits, _ = m(tokens, positions, mask, segment_ids_BxL=segments)
        total, n = masked_cross_entropy(logits, targets, mask)
        return total / n, logits

    fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
    if shardings is not None:
        params, rest = jax.device_put((params, rest), shardings)
    (_, logits), grads = fn(params, rest)
    return logits, nnx.to_pure_dict(grads)


def _max_deltas(ref_out, out, mask):
    (l0, g0), (l1, g1) = ref_out, out
    d_logits = float(jnp.abs(l0 - l1)[mask].max())
    d_grads = max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), g0, g1)))
    assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(g1)) > 0
    return d_logits, d_grads


CASES = {  # name: (sliding_window, B, L, packed pieces, {row: padded slice}); GQA throughout (N=4, K=2)
    # Causal, one example per row (no segment ids): a full row, one padded on the right, one on the left
    # (the left padding is what the kernel must keep out of the real tokens' attention).
    "causal_padded": (None, 3, 12, None, {1: (9, 12), 2: (0, 4)}),
    # Sliding window and packed rows (three examples, one row padded) over a row of 300 tokens, which the
    # wrapper pads to 384: three 128-token blocks, some skipped whole by the window, pieces across blocks.
    "window_packed_blocks": (40, 2, 300, (130, 100, 70), {1: (250, 300)}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_splash_equals_einsum(case):
    window, B, L, pieces, pad_rows = CASES[case]
    cfg = dataclasses.replace(CFG, sliding_window=window)
    tokens, positions, mask, segments = _batch(B, L, pieces, pad_rows)
    ref, splash = _models(cfg, "splash_interpret")
    outs = [_logits_and_grads(m, tokens, positions, mask, segments) for m in (ref, splash)]
    d_logits, d_grads = _max_deltas(*outs, mask)
    print(f"{case}: max|dlogits| {d_logits:.3g}, max|dgrad| {d_grads:.3g}")
    assert d_logits <= 1e-5 and d_grads <= 1e-5


@pytest.mark.slow
def test_splash_runs_per_device_under_a_mesh():
    """Batch over data x fsdp, heads over tensor: the kernel runs inside `shard_map` on 8 devices (here with a
    short sliding window, packed rows, a padded row, and remat)."""
    cfg = dataclasses.replace(CFG, sliding_window=5, remat=True)
    tokens, positions, mask, segments = _batch(4, 12, (7, 5), {3: (9, 12)})
    mesh = make_mesh(MeshConfig(2, 2, 2))
    ref, splash = _models(cfg, "splash_interpret")
    outs = []
    for model in (ref, splash):
        _, params, rest = nnx.split(model, nnx.LoRAParam, ...)
        shardings = (state_shardings(params, mesh), state_shardings(rest, mesh))
        batch = [x if x is None else jax.device_put(x, batch_sharding(mesh)) for x in (tokens, positions, mask, segments)]
        with jax.set_mesh(mesh):
            outs.append(_logits_and_grads(model, *batch, shardings=shardings))
    with jax.set_mesh(mesh):
        jaxpr = jax.make_jaxpr(lambda t, p, m, s: splash(t, p, m, segment_ids_BxL=s)[0])(tokens, positions, mask, segments)
    assert "shard_map" in str(jaxpr) and "pallas_call" in str(jaxpr)
    d_logits, d_grads = _max_deltas(*outs, mask)
    print(f"mesh 2x2x2: max|dlogits| {d_logits:.3g}, max|dgrad| {d_grads:.3g}")
    assert d_logits <= 1e-5 and d_grads <= 1e-5


def test_compiled_splash_refuses_other_backends():
    _, splash = _models(CFG, "splash")
    tokens, positions, mask, _ = _batch(2, 12, None, {})
    with pytest.raises(ValueError, match="ModelConfig.attention='splash'.*'splash_interpret'"):
        splash(tokens, positions, mask)


@pytest.mark.slow
def test_splash_forwards_on_a_kv_cache_keep_the_reference_path():
    """A prefill and a multi-token chunk on a cache: "splash" (compiled kernel, unusable on CPU) never runs the
    kernel there, so the logits are the einsum path's exactly."""
    cfg = dataclasses.replace(CFG, sliding_window=5)
    tokens, positions, _, _ = _batch(2, 10, None, {})
    fwd = nnx.jit(lambda m, t, p, mask, cache: m(t, p, mask, cache=cache))
    runs = []
    for model in _models(cfg, "splash"):
        cache = init_cache(cfg, 2, 16)
        steps = []
        for lo, hi in ((0, 6), (6, 9)):
            logits, cache = fwd(model, tokens[:, lo:hi], positions[:, lo:hi], jnp.ones((2, hi - lo), bool), cache)
            steps.append(logits)
        runs.append(steps)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
