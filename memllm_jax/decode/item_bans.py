"""Repeated-item bans for memory-write decoding: a call never writes the same item twice.

An undertrained memory-write model loops: after the items it knows, it writes one of them again and again
until the token budget ends the call (`A;B;B;B;...`), so the memory gets nothing the model would have written
next. With bans, when a row completes an item (chooses the item separator `;`) whose tokens equal an earlier
item of the same call, the row rewinds to the start of one of that item's fields (`BanSpec.field`: 0 the
subject, 1 the relation, 2 the object) and bans, after that same prefix, the field's first token; decoding then
goes on from there with the next-best choice. Like `no_repeat_ngram_size` in HF generation, but at the level of
whole items, so that a name or a relation label may recur in different items. After `BanSpec.max_bans` rewinds a
row stops at the start of the repeated item (status REPEAT).

Items and prefixes are compared by a polynomial hash of their tokens (uint32, wrapping); the cache is rewound by
setting the row's length and feeding the token before the rewind point again, which yields the logits there.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from memllm_jax import protocol

MAX_ITEMS = 64
"""Completed items remembered per row (a 192-token call holds at most ~32 items of a real relation label)."""
_BASE = 1_000_003
_POW_T = np.array([pow(_BASE, j, 2**32) for j in range(4096)], np.uint32)


@dataclasses.dataclass(frozen=True)
class BanSpec:
    max_bans: int
    """Rewinds per row before a repeated item stops the row."""
    item_sep_id: int
    """The token `;` that ends an item."""
    field_sep_id: int
    """The token `>>` between an item's fields."""
    start_id: int
    """The token before the call body (`({MEM_WRITE-->`), fed again when a row rewinds to the body's start."""
    field: int = 0
    """The field whose first token is banned: 0 subject, 1 relation, 2 object."""


@struct.dataclass
class ItemBans:
    start_len_B: jax.Array
    """int32 cache length before the call body (body token j sits at cache slot start_len_B + j)."""
    item_start_B: jax.Array
    """int32 body index where the current item starts."""
    item_hash_BxI: jax.Array
    """uint32 hashes of the row's completed items (first `n_items_B` valid)."""
    n_items_B: jax.Array
    ban_hash_BxK: jax.Array
    """uint32 hash of the prefix (tokens since the item start) after which `ban_tok_BxK` is banned."""
    ban_tok_BxK: jax.Array
    n_bans_B: jax.Array


def init_bans(start_len_B: jax.Array, max_bans: int) -> ItemBans:
    B = start_len_B.shape[0]
    K = max(max_bans, 1)
    return ItemBans(start_len_B=start_len_B, item_start_B=jnp.zeros(B, jnp.int32),
                    item_hash_BxI=jnp.zeros((B, MAX_ITEMS), jnp.uint32), n_items_B=jnp.zeros(B, jnp.int32),
                    ban_hash_BxK=jnp.zeros((B, K), jnp.uint32), ban_tok_BxK=jnp.zeros((B, K), jnp.int32),
                    n_bans_B=jnp.zeros(B, jnp.int32))


def span_hash(out_BxT: jax.Array, start_B: jax.Array, end_B: jax.Array) -> jax.Array:
    """uint32 hash of each row's tokens `out_BxT[b, start_B[b]:end_B[b]]` (equal spans, equal hashes)."""
    T = out_BxT.shape[1]
    j_T = jnp.arange(T)
    inside_BxT = (j_T[None, :] >= start_B[:, None]) & (j_T[None, :] < end_B[:, None])
    pow_BxT = jnp.asarray(_POW_T[:T])[jnp.clip(j_T[None, :] - start_B[:, None], 0, T - 1)]
    terms_BxT = jnp.where(inside_BxT, (out_BxT.astype(jnp.uint32) + 1) * pow_BxT, 0).astype(jnp.uint32)
    length_B = (end_B - start_B).astype(jnp.uint32)
    return jnp.sum(terms_BxT, axis=1, dtype=jnp.uint32) + length_B * jnp.uint32(2_654_435_761)


def mask_banned(logits_BxV: jax.Array, bans: ItemBans, prefix_hash_B: jax.Array) -> jax.Array:
    """`logits_BxV` with -inf on each token banned after the row's current item prefix."""
    K = bans.ban_tok_BxK.shape[1]
    hit_BxK = (bans.ban_hash_BxK == prefix_hash_B[:, None]) & (jnp.arange(K)[None, :] < bans.n_bans_B[:, None])
    B = logits_BxV.shape[0]
    return logits_BxV.at[jnp.arange(B)[:, None], bans.ban_tok_BxK].min(jnp.where(hit_BxK, -jnp.inf, jnp.inf))


def _field_start(out_BxT: jax.Array, item_start_B: jax.Array, n_B: jax.Array, spec: BanSpec) -> jax.Array:
    """Body index where field `spec.field` of the current item starts (the item start when it has no such
    field or the field is empty)."""
    if spec.field == 0:
        return item_start_B
    T = out_BxT.shape[1]
    j_T = jnp.arange(T)
    inside_BxT = (j_T[None, :] >= item_start_B[:, None]) & (j_T[None, :] < n_B[:, None])
    is_sep_BxT = inside_BxT & (out_BxT == spec.field_sep_id)
    kth_BxT = is_sep_BxT & (jnp.cumsum(is_sep_BxT, axis=1) == spec.field)
    start_B = jnp.argmax(kth_BxT, axis=1).astype(jnp.int32) + 1
    ok_B = jnp.any(kth_BxT, axis=1) & (start_B < n_B)
    return jnp.where(ok_B, start_B, item_start_B)


@dataclasses.dataclass(frozen=True)
class BanStep:
    """What `on_token` decided for one step."""
    bans: ItemBans
    rewind_B: jax.Array
    """bool: the row rewinds instead of feeding its token."""
    stop_B: jax.Array
    """bool: the row repeated an item with no bans left; it stops with its body cut at `n_B`."""
    n_B: jax.Array
    """int32 body length after the step's rewind or stop (rows that do neither: unchanged)."""
    feed_tok_B: jax.Array
    """int32 the token a rewinding row feeds again (the one before its rewind point)."""
    feed_len_B: jax.Array
    """int32 the cache length a rewinding row feeds that token at."""


def on_token(bans: ItemBans, spec: BanSpec, out_BxT: jax.Array, n_B: jax.Array, prefix_hash_B: jax.Array,
             tok_B: jax.Array, feed_B: jax.Array) -> BanStep:
    """Rows about to feed `tok_B` (where `feed_B`): an item separator completing an item already written rewinds
    the row (or stops it); one completing a new item records it."""
    B, I = bans.item_hash_BxI.shape
    sep_B = feed_B & (tok_B == spec.item_sep_id)
    seen_B = jnp.any((bans.item_hash_BxI == prefix_hash_B[:, None]) & (jnp.arange(I)[None, :] < bans.n_items_B[:, None]),
                     axis=1)
    repeat_B = sep_B & seen_B & (n_B > bans.item_start_B)
    rewind_B = repeat_B & (bans.n_bans_B < spec.max_bans)
    stop_B = repeat_B & ~rewind_B
    new_B = sep_B & ~repeat_B & (bans.n_items_B < I)

    at_B = _field_start(out_BxT, bans.item_start_B, n_B, spec)
    K = bans.ban_tok_BxK.shape[1]
    slot_B = jnp.where(rewind_B, bans.n_bans_B, K)
    rows = jnp.arange(B)
    ban_hash = span_hash(out_BxT, bans.item_start_B, at_B)
    ban_tok = jnp.take_along_axis(out_BxT, jnp.clip(at_B, 0, out_BxT.shape[1] - 1)[:, None], 1)[:, 0]
    prev_B = jnp.take_along_axis(out_BxT, jnp.clip(at_B - 1, 0, out_BxT.shape[1] - 1)[:, None], 1)[:, 0]
    new_bans = bans.replace(
        item_start_B=jnp.where(sep_B & ~repeat_B, n_B + 1, bans.item_start_B),
        item_hash_BxI=bans.item_hash_BxI.at[rows, jnp.where(new_B, bans.n_items_B, I)].set(prefix_hash_B, mode="drop"),
        n_items_B=bans.n_items_B + new_B.astype(jnp.int32),
        ban_hash_BxK=bans.ban_hash_BxK.at[rows, slot_B].set(ban_hash, mode="drop"),
        ban_tok_BxK=bans.ban_tok_BxK.at[rows, slot_B].set(ban_tok, mode="drop"),
        n_bans_B=bans.n_bans_B + rewind_B.astype(jnp.int32))
    return BanStep(bans=new_bans, rewind_B=rewind_B, stop_B=stop_B,
                   n_B=jnp.where(rewind_B, at_B, jnp.where(stop_B, bans.item_start_B, n_B)),
                   feed_tok_B=jnp.where(at_B > 0, prev_B, spec.start_id),
                   feed_len_B=bans.start_len_B + at_B - 1)


def ban_spec(tokenizer, max_bans: int, field: int = 0) -> BanSpec:
    """The `BanSpec` for `tokenizer`, whose `;` and `>>` must each be one token (else items cannot be told
    apart token by token)."""
    ids = {sep: tokenizer.encode(sep) for sep in (protocol.ITEM_SEP, protocol.FIELD_SEP)}
    for sep, got in ids.items():
        if len(got) != 1:
            raise ValueError(f"repeated-item bans need {sep!r} to be one token; this tokenizer gives {got}")
    return BanSpec(max_bans=max_bans, item_sep_id=ids[protocol.ITEM_SEP][0], field_sep_id=ids[protocol.FIELD_SEP][0],
                   start_id=tokenizer.marker_id[protocol.MEM_WRITE], field=field)
