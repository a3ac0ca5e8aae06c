"""Copied names for memory-write decoding: a call's subjects and objects are copied from the prompt's text and
its relations are known relation labels.

The paper's memory-write model copies names from the sentence it reads. An undertrained one also writes names
that are in no text (`USS Leedstown (APA-56)>>created by>>Liquefied` for a sentence on the Lockheed Shipbuilding
and Engineering Company), which the grounding check then throws away. With copying, inside a name field a row
takes the model's best choice among its `CopySpec.top_k` best tokens that keeps the field a piece of the
prompt's text starting at a word start, and may end the field (`>>`, `;`, `})`) only at a word end; inside the
relation field it keeps the field a prefix of a relation label and ends it only at a label's end. When none of
the top-k qualifies the row takes its unconstrained choice (the grounding check judges that item later). Like
the copy mechanism of pointer networks, but imposed at decoding time on a model trained without it. A chosen
token keeps the model's own log-probability, so the memory's confidence threshold still sees how unlikely a
forced copy was.

Matching is on bytes. Each row carries a source: its prompt's text (token by token; a special token becomes a 0
byte, so no name spans it) followed by the relation labels, each after a 0 byte, and a boolean vector of the
source positions at which the current field's text could go on (`CopyState.match_BxL`). A candidate token of m
bytes is allowed where some such position p has `source[p:p+m]` equal to its bytes; the new positions are the
p + m. Each step costs B x top_k x source length x token bytes byte comparisons, a few percent of a 135M model's
decoding step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Collection, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from memllm_jax import protocol

TOKEN_BYTES = 16
"""Longest token (in bytes) a name may be copied with; a longer token is never allowed inside a field."""
UNCONSTRAINED = 3
"""`CopyState.field_B` of an item with more than three fields: malformed, left to the model."""


@dataclasses.dataclass(frozen=True)
class CopySpec:
    field_sep_id: int
    item_sep_id: int
    close_id: int
    eos_id: int
    digest: str
    """Hash of the token table and labels: equal specs compile once (the arrays are not compared)."""
    token_bytes_VxK: np.ndarray = dataclasses.field(compare=False, repr=False)
    """uint8 bytes of each token, 0-padded to `TOKEN_BYTES`."""
    token_len_V: np.ndarray = dataclasses.field(compare=False, repr=False)
    """int32 byte length of each token; -1 for special tokens and tokens that cannot be copied."""
    labels: bytes = b""
    """The relation labels, each after a 0 byte (empty: the relation field is not constrained)."""
    top_k: int = 16
    source_len: int = 0
    """Bytes per row source (`sources`); set per decoding by `with_source_len`."""

    def with_source_len(self, longest_prompt_bytes: int) -> "CopySpec":
        """This spec with room for prompts of up to `longest_prompt_bytes` bytes (rounded up to 256: few compiles)."""
        n = longest_prompt_bytes + len(self.labels) + 2
        return dataclasses.replace(self, source_len=-(-n // 256) * 256)


@struct.dataclass
class CopyState:
    source_BxL: jax.Array
    """uint8 prompt bytes, then the labels (0 elsewhere)."""
    field_B: jax.Array
    """int32 the field being written: 0 subject, 1 relation, 2 object, `UNCONSTRAINED` beyond."""
    empty_B: jax.Array
    """bool: nothing written in the field yet."""
    match_BxL: jax.Array
    """bool: positions p such that the field so far equals source[q:p] for an allowed start q."""


def _byte_level_decoder(tokenizer) -> dict[str, int] | None:
    """The inverse of GPT-2's bytes-to-unicode map when `tokenizer` decodes with a byte-level decoder."""
    backend = getattr(tokenizer, "_tok", None)
    if backend is None or "ByteLevel" not in type(getattr(backend, "decoder", None)).__name__:
        return None
    from transformers.convert_slow_tokenizer import bytes_to_unicode  # noqa: PLC0415

    return {c: b for b, c in bytes_to_unicode().items()}


def token_table(tokenizer) -> list[bytes | None]:
    """The bytes each token id stands for; None for special tokens (markers, BOS, EOS, padding)."""
    special = set(tokenizer.marker_id.values()) | {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
    inverse = _byte_level_decoder(tokenizer)
    byte_token = re.compile(r"<0x([0-9A-Fa-f]{2})>")
    table: list[bytes | None] = []
    for i in range(tokenizer.vocab_size):
        piece = tokenizer.id_to_token(i) if hasattr(tokenizer, "id_to_token") else None
        if i in special:
            table.append(None)
        elif piece is None:
            table.append(tokenizer.decode([i]).encode("utf-8") or None)
        elif inverse is not None and all(c in inverse for c in piece):
            table.append(bytes(inverse[c] for c in piece))
        elif byte_token.fullmatch(piece):  # sentencepiece byte fallback
            table.append(bytes([int(byte_token.fullmatch(piece).group(1), 16)]))
        else:
            table.append(piece.replace("\u2581", " ").encode("utf-8"))  # sentencepiece marks a space with ▁
    return table


def copy_spec(tokenizer, relations: Collection[str] | None = None, top_k: int = 16) -> CopySpec:
    """The `CopySpec` for `tokenizer` (whose `;` and `>>` must each be one token) and the relation labels
    `relations` (None: relations unconstrained)."""
    seps = {sep: tokenizer.encode(sep) for sep in (protocol.ITEM_SEP, protocol.FIELD_SEP)}
    for sep, got in seps.items():
        if len(got) != 1:
            raise ValueError(f"copied names need {sep!r} to be one token; this tokenizer gives {got}")
    table = token_table(tokenizer)
    V = len(table)
    bytes_VxK = np.zeros((V, TOKEN_BYTES), np.uint8)
    len_V = np.full(V, -1, np.int32)
    for i, b in enumerate(table):
        if b and len(b) <= TOKEN_BYTES and 0 not in b:
            bytes_VxK[i, :len(b)] = np.frombuffer(b, np.uint8)
            len_V[i] = len(b)
    labels = b"".join(b"\0" + protocol.escape_name(r).encode("utf-8") for r in sorted(relations or ()))
    digest = hashlib.sha1(bytes_VxK.tobytes() + len_V.tobytes() + labels).hexdigest()
    return CopySpec(field_sep_id=seps[protocol.FIELD_SEP][0], item_sep_id=seps[protocol.ITEM_SEP][0],
                    close_id=tokenizer.marker_id[protocol.CALL_END], eos_id=tokenizer.eos_id, digest=digest,
                    token_bytes_VxK=bytes_VxK, token_len_V=len_V, labels=labels, top_k=top_k)


def prompt_bytes(prompt_ids: Sequence[int], spec: CopySpec) -> bytes:
    """The text a prompt's names may be copied from: its tokens' bytes, a special token as a 0 byte."""
    return b"".join(spec.token_bytes_VxK[t, :n].tobytes() if n > 0 else b"\0"
                    for t, n in ((int(t), int(spec.token_len_V[int(t)])) for t in prompt_ids))


def with_room_for(spec: CopySpec, prompts: Sequence[Sequence[int]]) -> CopySpec:
    return spec.with_source_len(max((len(prompt_bytes(p, spec)) for p in prompts), default=0))


def sources(prompts: Sequence[Sequence[int]], spec: CopySpec, rows: int | None = None) -> np.ndarray:
    """uint8 [rows, spec.source_len]: each prompt's bytes from the start, the labels and a 0 byte at the end
    (the same positions in every row), zeros between them (rows past the prompts: the labels only)."""
    tail = np.frombuffer(spec.labels + b"\0", np.uint8)
    out = np.zeros((len(prompts) if rows is None else rows, spec.source_len), np.uint8)
    out[:, spec.source_len - len(tail):] = tail
    for b, ids in enumerate(prompts):
        text = prompt_bytes(ids, spec)
        if len(text) + len(tail) >= spec.source_len:
            raise ValueError(f"prompt {b}: {len(text)} bytes of text, room for {spec.source_len - len(tail) - 1}")
        out[b, :len(text)] = np.frombuffer(text, np.uint8)
    return out


# ------------------------------------------------------------------------------------------------ in the loop


def _is_word(x):
    """Bytes of a word: ASCII letters and digits, and every byte of a non-ASCII character."""
    return ((x >= ord("0")) & (x <= ord("9"))) | ((x >= ord("A")) & (x <= ord("Z"))) | \
        ((x >= ord("a")) & (x <= ord("z"))) | (x >= 0x80)


def _zones(source_BxL: jax.Array, spec: CopySpec):
    """(name start, name end, label start, label end) masks over source positions. A name starts at a byte
    that is no space after a byte that is no word byte, and ends before a byte that is no word byte after one
    that is neither a space nor a comma; a label spans from one 0 byte to the next in the source's last `len(labels) + 1` bytes."""
    L = source_BxL.shape[1]
    prev_BxL = jnp.pad(source_BxL, ((0, 0), (1, 0)))[:, :L]
    is_label_L = jnp.arange(L) >= L - len(spec.labels) - 1 if spec.labels else jnp.zeros(L, bool)
    text_BxL = (source_BxL != 0) & (source_BxL != ord(" "))
    name_start = ~is_label_L & text_BxL & ~_is_word(prev_BxL)
    name_end = ~is_label_L & ~_is_word(source_BxL) & (prev_BxL != 0) & (prev_BxL != ord(" ")) & (prev_BxL != ord(","))
    label_start = is_label_L & (source_BxL != 0) & (prev_BxL == 0)
    label_end = is_label_L & (source_BxL == 0) & (prev_BxL != 0)
    return name_start, name_end, label_start, label_end


def _starts(c: CopyState, field_B: jax.Array, spec: CopySpec) -> jax.Array:
    """The `match_BxL` of an empty field `field_B`."""
    name_start, _, label_start, _ = _zones(c.source_BxL, spec)
    label_field_B = (field_B == 1) & (len(spec.labels) > 0)
    return jnp.where(label_field_B[:, None], label_start, name_start & ((field_B == 0) | (field_B == 2))[:, None])


def init_copy(sources_BxL: jax.Array, spec: CopySpec) -> CopyState:
    B = sources_BxL.shape[0]
    c = CopyState(source_BxL=sources_BxL, field_B=jnp.zeros(B, jnp.int32), empty_B=jnp.ones(B, bool),
                  match_BxL=jnp.zeros(sources_BxL.shape, bool))
    return c.replace(match_BxL=_starts(c, c.field_B, spec))


def _can_end(c: CopyState, spec: CopySpec) -> jax.Array:
    _, name_end, _, label_end = _zones(c.source_BxL, spec)
    end_BxL = jnp.where(((c.field_B == 1) & (len(spec.labels) > 0))[:, None], label_end, name_end)
    return ~c.empty_B & jnp.any(c.match_BxL & end_BxL, axis=1)


@dataclasses.dataclass(frozen=True)
class Candidates:
    tok_BxC: jax.Array
    """int32 the model's top-k tokens, best first."""
    allowed_BxC: jax.Array
    match_BxCxL: jax.Array
    """bool the field's `match_BxL` after each candidate (a text token; all False for the others)."""


def candidates(logits_BxV: jax.Array, c: CopyState, spec: CopySpec) -> Candidates:
    """The top-k tokens of each row and which of them keep the field copied."""
    _, tok_BxC = jax.lax.top_k(logits_BxV, spec.top_k)
    bytes_BxCxK = jnp.asarray(spec.token_bytes_VxK)[tok_BxC]
    len_BxC = jnp.asarray(spec.token_len_V)[tok_BxC]
    B, L = c.source_BxL.shape
    ok_BxCxL = c.match_BxL[:, None, :] & (len_BxC > 0)[:, :, None]
    padded_BxL = jnp.pad(c.source_BxL, ((0, 0), (0, TOKEN_BYTES)))
    for j in range(TOKEN_BYTES):
        at_BxL = padded_BxL[:, j:j + L]
        ok_BxCxL &= (j >= len_BxC[:, :, None]) | (at_BxL[:, None, :] == bytes_BxCxK[:, :, j, None])
    # Positions after the token: p + len (a shift per candidate, as a gather from p - len).
    back_BxCxL = jnp.arange(L)[None, None, :] - len_BxC[:, :, None]
    match_BxCxL = jnp.take_along_axis(ok_BxCxL, jnp.clip(back_BxCxL, 0, L - 1), axis=2) & (back_BxCxL >= 0)
    field_B = c.field_B[:, None]
    can_end_B = _can_end(c, spec)[:, None]
    if not spec.labels:  # a free relation field: any text, ended by `>>` once not empty
        can_end_B |= (field_B == 1) & ~c.empty_B[:, None]
    can_close_B = ((field_B == 2) & can_end_B) | ((field_B == 0) & c.empty_B[:, None])
    allowed = jnp.where(tok_BxC == spec.field_sep_id, (field_B < 2) & can_end_B,
              jnp.where(tok_BxC == spec.item_sep_id, (field_B == 2) & can_end_B,
              jnp.where((tok_BxC == spec.close_id) | (tok_BxC == spec.eos_id), can_close_B,
                        jnp.any(match_BxCxL, axis=2) | ((field_B == 1) & (len_BxC > 0) & (not spec.labels)))))
    allowed |= field_B >= UNCONSTRAINED
    return Candidates(tok_BxC=tok_BxC, allowed_BxC=allowed, match_BxCxL=match_BxCxL)


def choose(cand: Candidates, first_B: jax.Array, second_B: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The best and second-best allowed candidates; a row with none allowed keeps the unconstrained
    `first_B` / `second_B` (one allowed: that one and the unconstrained second)."""
    C = cand.tok_BxC.shape[1]
    i_BxC = jnp.arange(C)[None, :]
    a = jnp.argmax(cand.allowed_BxC, axis=1)
    has_a = jnp.any(cand.allowed_BxC, axis=1)
    rest_BxC = cand.allowed_BxC & (i_BxC != a[:, None])
    b = jnp.argmax(rest_BxC, axis=1)
    has_b = jnp.any(rest_BxC, axis=1)
    pick = lambda i: jnp.take_along_axis(cand.tok_BxC, i[:, None], 1)[:, 0]  # noqa: E731
    return jnp.where(has_a, pick(a), first_B), jnp.where(has_a & has_b, pick(b), second_B)


def advance(c: CopyState, cand: Candidates, spec: CopySpec, tok_B: jax.Array, keep_B: jax.Array,
            restart_B: jax.Array, restart_field_B: jax.Array) -> CopyState:
    """The state after rows `keep_B` wrote `tok_B` and rows `restart_B` went back to the start of field
    `restart_field_B` (a repeated-item ban's rewind)."""
    sep_B = (tok_B == spec.field_sep_id) | (tok_B == spec.item_sep_id)
    field_B = jnp.where(tok_B == spec.field_sep_id, jnp.minimum(c.field_B + 1, UNCONSTRAINED),
                        jnp.where(tok_B == spec.item_sep_id, 0, c.field_B))
    hit_BxC = cand.tok_BxC == tok_B[:, None]  # top-k tokens are distinct: at most one hit (none: a fallback)
    after_BxL = jnp.any(hit_BxC[:, :, None] & cand.match_BxCxL, axis=1)
    field_B = jnp.where(restart_B, restart_field_B, jnp.where(keep_B, field_B, c.field_B))
    reset_B = restart_B | (keep_B & sep_B)
    match_BxL = jnp.where(reset_B[:, None], _starts(c, field_B, spec),
                          jnp.where(keep_B[:, None], after_BxL, c.match_BxL))
    return c.replace(field_B=field_B, empty_B=jnp.where(reset_B, True, jnp.where(keep_B, False, c.empty_B)),
                     match_BxL=match_BxL)
