"""The pytree carried by the jitted decode loops, and the row status codes the host reads at loop exits."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

RUNNING = 0
"""The row is generating."""
EOS = 1
"""The row emitted the end token."""
READ_PAUSE = 2
"""The row closed the queries of an open read call with `)-->`: the host answers it."""
OPEN_PAUSE = 3
"""The row opened a new read call while an earlier call is still in its context: the host removes the
earlier call (paper §3.2, case iii)."""
BUDGET = 4
"""The row used up its token budget."""
FULL = 5
"""The row's KV cache is full."""
STOPPED = 6
"""Late stopping ended the row (memory writes: K cut points without improvement)."""
IDLE = 7
"""The host finished with this row (or the row is batch padding)."""
HOST_FEED = 8
"""In-loop reads only: a call was served inside the loop, but the tokens to feed next (an answer, or the text
re-fed after removing a call) do not fit the forced-token queue; the host prefills them at the loop exit."""

REPEAT = 9
"""Memory writes: the row would write an item again after its item bans ran out (`item_bans`)."""
DONE = 10
"""The row sampled one of the caller's stop tokens outside any call (`LoopSpec.stop_ids`)."""

STATUS_NAMES = {RUNNING: "running", EOS: "eos", READ_PAUSE: "read", OPEN_PAUSE: "open", BUDGET: "budget",
                FULL: "cache_full", STOPPED: "late_stop", IDLE: "idle", HOST_FEED: "host_feed", REPEAT: "repeat",
                DONE: "done"}


@struct.dataclass
class DecodeState:
    """Everything the read loop carries. The cache holds every context token; `logits_BxV` is the
    distribution of each row's next token (computed from the last cached token)."""

    cache: Any
    """The model's KV cache (`lengths_B` valid slots per row; slot == absolute position)."""
    logits_BxV: jax.Array
    """float32 next-token logits."""
    out_BxC: jax.Array
    """int32 tokens generated during the current chunk (reset by the host before each chunk)."""
    n_out_B: jax.Array
    """int32 tokens written to `out_BxC` this chunk."""
    status_B: jax.Array
    """int32 status code (see the module constants)."""
    budget_B: jax.Array
    """int32 tokens each row may still generate."""
    in_call_B: jax.Array
    """bool: the row is inside a read call (after `({MEM_READ(`, before `)-->`)."""
    active_call_B: jax.Array
    """bool: an earlier read call is still in the row's context (opening a new one pauses the row)."""
    ban_read_B: jax.Array
    """bool: the next token may not open a read call (set after a call was removed at this point)."""
    rng: jax.Array
    """PRNG key for sampling."""
    forced_BxF: Any = None
    """In-loop reads only (else None): int32 tokens each row must feed before it samples again (a memory
    answer, or the tokens re-fed after a call was removed), filled by the in-loop host callback."""
    forced_pos_B: Any = None
    """int32 forced tokens already fed."""
    forced_len_B: Any = None
    """int32 forced tokens queued (the row samples again once `forced_pos_B == forced_len_B`)."""


_ROW_COLUMNS = ("status_B", "budget_B", "n_out_B", "in_call_B", "active_call_B", "ban_read_B")


def pack_rows(s: DecodeState) -> jax.Array:
    """int32 B x (9 + C) (in-loop reads: 11 + C): every per-row field the host reads at a loop exit, in one
    array, so a loop exit costs one device-to-host transfer (`HostRows.unpack`), not one per field."""
    columns = [getattr(s, name) for name in _ROW_COLUMNS] + [s.cache.lengths_B]
    if s.forced_BxF is not None:
        columns += [s.forced_pos_B, s.forced_len_B]
    return jnp.concatenate([jnp.stack([c.astype(jnp.int32) for c in columns], axis=1), s.out_BxC], axis=1)


@dataclasses.dataclass
class HostRows:
    """Host (numpy) copies of a `DecodeState`'s per-row fields, as `pack_rows` packs them."""

    status_B: np.ndarray
    budget_B: np.ndarray
    n_out_B: np.ndarray
    in_call_B: np.ndarray
    active_call_B: np.ndarray
    ban_read_B: np.ndarray
    lengths_B: np.ndarray
    """The cache's `lengths_B`."""
    out_BxC: np.ndarray
    forced_pos_B: np.ndarray | None = None
    forced_len_B: np.ndarray | None = None

    @classmethod
    def unpack(cls, packed: np.ndarray, forced: bool) -> "HostRows":
        """The fields of `pack_rows(s)` fetched to the host; `forced`: the state has the in-loop queue."""
        n = len(_ROW_COLUMNS) + 1 + 2 * forced
        cols = {name: packed[:, i] for i, name in enumerate(_ROW_COLUMNS + ("lengths_B",))}
        for name in ("in_call_B", "active_call_B", "ban_read_B"):
            cols[name] = cols[name].astype(bool)
        if forced:
            cols["forced_pos_B"], cols["forced_len_B"] = packed[:, n - 2], packed[:, n - 1]
        return cls(out_BxC=packed[:, n:], **cols)


@struct.dataclass
class WriteState:
    """What the late-stopping write loop carries (paper Appendix A)."""

    cache: Any
    logits_BxV: jax.Array
    out_BxT: jax.Array
    """int32 tokens chosen so far (the call body after the forced `({MEM_WRITE-->`)."""
    n_out_B: jax.Array
    status_B: jax.Array
    sum_logp_B: jax.Array
    """float32 sum of the log-probabilities of the chosen tokens."""
    logp_BxT: jax.Array
    """float32 log-probability of each chosen token (aligned with `out_BxT`): how sure the model was of each
    written item (`writer.item_confidences`)."""
    best_score_B: jax.Array
    """float32 best average log-probability at a cut point (-inf before the first)."""
    best_cut_B: jax.Array
    """int32 number of body tokens before the best cut point (-1 before the first)."""
    n_cuts_B: jax.Array
    """int32 cut points recorded."""
    no_improve_B: jax.Array
    """int32 consecutive cut points that did not beat the best."""
    bans: Any = None
    """`item_bans.ItemBans` when the call may not repeat an item, else None."""
