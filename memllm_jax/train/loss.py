"""Masked token cross-entropy returning `(sum, n_tokens)`; the caller divides once per global batch.

Dividing per micro-batch (or per sequence) would over-weight short API spans; summing and normalising by the
loss-token count of the whole global batch makes gradient accumulation equal to one large batch.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_cross_entropy(logits_BxLxV: jax.Array, targets_BxL: jax.Array, loss_mask_BxL: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(sum of -log p(target) over positions where loss_mask, number of such positions)`, float32.

    Masked positions contribute exactly zero (also zero gradient), whatever their target id.
    """
    logits = logits_BxLxV.astype(jnp.float32)
    log_z_BxL = jax.nn.logsumexp(logits, axis=-1)
    target_logit_BxL = jnp.take_along_axis(logits, targets_BxL[..., None].astype(jnp.int32), axis=-1)[..., 0]
    mask = loss_mask_BxL.astype(bool)
    nll_BxL = jnp.where(mask, log_z_BxL - target_logit_BxL, 0.0)
    return nll_BxL.sum(), mask.sum().astype(jnp.float32)
