"""The memory-write step and its exit test, run by the decoding loop (`loop.run_steps`): `writer.decode_writes`
runs it until every row has stopped, `refill` until enough rows have stopped to refill them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from memllm_jax.decode import item_bans, state as st
from memllm_jax.decode.loop import run_steps
from memllm_jax.decode.sampling import argmax


def write_step(model, spec, s: st.WriteState) -> st.WriteState:
    """One token per running row of a memory-write call (`writer` module docstring): greedy with late stopping's
    cut points, item bans (`spec.bans`) as a logit mask before the choice and a rewind after it. `spec`: a
    `writer.WriteSpec`."""
    B, T = s.out_BxT.shape
    running_B = s.status_B == st.RUNNING
    logits_BxV = s.logits_BxV
    if spec.bans is not None:
        prefix_hash_B = item_bans.span_hash(s.out_BxT, s.bans.item_start_B, s.n_out_B)
        logits_BxV = item_bans.mask_banned(logits_BxV, s.bans, prefix_hash_B)
    logp_BxV = jax.nn.log_softmax(logits_BxV, axis=-1)
    # Top-2 by two argmaxes: lax.top_k lowers to a full sort of every row on CPU (~1 ms per step at B=16).
    first_B = argmax(logits_BxV)
    hit_BxV = jnp.arange(logits_BxV.shape[1])[None, :] == first_B[:, None]
    second_B = argmax(jnp.where(hit_BxV, -jnp.inf, logits_BxV))
    is_cut_B = running_B & (first_B == spec.close_id)
    cut_score_B = (s.sum_logp_B + logp_BxV[:, spec.close_id]) / (s.n_out_B + 1).astype(jnp.float32)
    improve_B = is_cut_B & (cut_score_B > s.best_score_B)
    no_improve_B = jnp.where(is_cut_B, jnp.where(improve_B, 0, s.no_improve_B + 1), s.no_improve_B)
    stop_B = is_cut_B & ((no_improve_B >= spec.patience) | (not spec.late_stopping))
    feed_B = running_B & ~stop_B
    tok_B = jnp.where(is_cut_B, second_B, first_B)
    tok_B = jnp.where(feed_B, tok_B, 0)
    keep_B, n_B, cache, bans = feed_B, s.n_out_B + feed_B.astype(jnp.int32), s.cache, s.bans
    model_tok_B, model_feed_B, repeat_B, dropped_B = tok_B, feed_B, jnp.zeros(B, bool), 0.0
    if spec.bans is not None:
        ban = item_bans.on_token(s.bans, spec.bans, s.out_BxT, s.n_out_B, prefix_hash_B, tok_B, feed_B)
        keep_B = feed_B & ~ban.rewind_B & ~ban.stop_B
        n_B = jnp.where(keep_B, n_B, ban.n_B)
        model_tok_B = jnp.where(ban.rewind_B, ban.feed_tok_B, tok_B)
        model_feed_B = feed_B & ~ban.stop_B
        cache = cache.replace(lengths_B=jnp.where(ban.rewind_B, ban.feed_len_B, cache.lengths_B))
        bans, repeat_B = ban.bans, ban.stop_B
        taken_back_BxT = (jnp.arange(T)[None, :] >= n_B[:, None]) & (jnp.arange(T)[None, :] < s.n_out_B[:, None])
        dropped_B = jnp.sum(jnp.where(taken_back_BxT, s.logp_BxT, 0.0), axis=1)  # log-probs of rewound tokens
    logits_Bx1xV, cache = model(model_tok_B[:, None], cache.lengths_B[:, None], model_feed_B[:, None], cache=cache)
    at_B = jnp.where(keep_B, s.n_out_B, T)
    logp_tok_B = jnp.take_along_axis(logp_BxV, tok_B[:, None], 1)[:, 0]
    out_BxT = s.out_BxT.at[jnp.arange(B), at_B].set(tok_B, mode="drop")
    status_B = jnp.where(stop_B, st.STOPPED, s.status_B)
    status_B = jnp.where(keep_B & (n_B >= spec.max_new_tokens), st.BUDGET, status_B)
    status_B = jnp.where(model_feed_B & (cache.lengths_B >= spec.max_len), st.FULL, status_B)
    status_B = jnp.where(repeat_B, st.REPEAT, status_B)
    status_B = jnp.where(keep_B & (tok_B == spec.eos_id), st.EOS, status_B)
    best_score_B = jnp.where(improve_B, cut_score_B, s.best_score_B)
    best_cut_B = jnp.where(improve_B, s.n_out_B, s.best_cut_B)
    lost_B = best_cut_B > n_B  # a cut point inside the tokens a rewind took back
    return s.replace(
        cache=cache,
        logits_BxV=jnp.where(model_feed_B[:, None], logits_Bx1xV[:, 0], s.logits_BxV),
        out_BxT=out_BxT,
        logp_BxT=s.logp_BxT.at[jnp.arange(B), at_B].set(logp_tok_B, mode="drop"),
        n_out_B=n_B,
        status_B=status_B,
        sum_logp_B=s.sum_logp_B + jnp.where(keep_B, logp_tok_B, 0.0) - dropped_B,
        best_score_B=jnp.where(lost_B, -jnp.inf, best_score_B),
        best_cut_B=jnp.where(lost_B, -1, best_cut_B),
        n_cuts_B=s.n_cuts_B + is_cut_B.astype(jnp.int32),
        no_improve_B=no_improve_B,
        bans=bans,
    )


def run_writes(model, spec, s: st.WriteState, exit_at_rows) -> tuple[st.WriteState, jax.Array]:
    """`write_step` until no row runs or at least `exit_at_rows` rows are not running (more rows than the batch:
    until none runs); the cache in the loop's form (`graph.layered`). Also returns the steps run."""
    def more(_, s):
        running_B = s.status_B == st.RUNNING
        return jnp.any(running_B) & (jnp.sum(~running_B) < exit_at_rows)

    return run_steps(lambda s: write_step(model, spec, s), more, s)
