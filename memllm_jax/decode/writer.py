"""Memory-write calls decoded (paper §3.2, Appendix A): a batch of write prompts (one focus sentence each, with
its pretext), each row's call decoded with late stopping in one jitted loop and parsed into triples. Whole
documents go through `corpus_writer` (prompts, checks, the memory); a pool refilled as its rows stop is `refill`.

Late stopping: greedy, except that when the closing token `})` is the top choice, the position is recorded
as a cut point with score = average log-probability of the body so far plus that closing token, and the
second-best token is taken instead. Decoding stops once K consecutive cut points fail to beat the best
score (or at EOS, the token budget, a full cache); the call is cut at the best point. A row that never
reaches a cut point writes nothing.

Item bans (`item_bans`, optional): a call never writes an item twice; a row that would rewinds to the item's
start and takes its next choice there.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memllm_jax import protocol
from memllm_jax.decode import item_bans, state as st
from memllm_jax.decode.graph import cache_factory, layered, merge, split_model, stacked, vocab_size
from memllm_jax.decode.prefill import prefill, prefill_shared
from memllm_jax.decode.shapes import cache_slots
from memllm_jax.decode.step import run_writes

PATIENCE = 5
"""K in Appendix A."""


@dataclasses.dataclass(frozen=True)
class WriteDecoding:
    """How memory-write calls are decoded: every option a caller chooses, passed whole from `memllm write`, the
    pipeline's config and Table 3's edits down to the loop (`write_decoding` builds it from the user's settings;
    `write_spec` adds what follows from the tokenizer and the prompts)."""
    max_new_tokens: int = 128
    """The call body's token budget."""
    late_stopping: bool = True
    """False: plain greedy decoding that ends at the first `})`."""
    patience: int = PATIENCE
    """K of late stopping (module docstring)."""
    bans: item_bans.BanSpec | None = None
    """Never write an item twice in one call (`item_bans`)."""

    def __post_init__(self):
        """Refuses values the loop cannot use; the message starts with the field's name (callers name their own
        option after it: `--max-new-tokens`, the setting `write.max_new_tokens`)."""
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens {self.max_new_tokens}: must be at least 1")
        if self.patience < 1:
            raise ValueError(f"patience {self.patience}: must be at least 1")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WriteSpec(WriteDecoding):
    """The loop's static settings: the decoding options plus the token ids and the cache length."""
    close_id: int
    eos_id: int
    max_len: int


def write_decoding(tokenizer, *, ban_repeats: int = 0, **options) -> WriteDecoding:
    """A `WriteDecoding` from the settings a user gives (`memllm memory write`, the pipeline's `write` group):
    `ban_repeats` > 0 bans a repeated item at most that many times per call (`item_bans`); `options`: the other
    fields. A refused setting is a ValueError whose message starts with the setting's name."""
    if ban_repeats < 0:
        raise ValueError(f"ban_repeats {ban_repeats}: must be 0 (off) or more")
    try:
        bans = item_bans.ban_spec(tokenizer, ban_repeats) if ban_repeats > 0 else None
    except ValueError as exc:  # a tokenizer whose separators are not single tokens
        raise ValueError(f"ban_repeats {ban_repeats}: {exc}") from exc
    return WriteDecoding(bans=bans, **options)


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def write_loop(graphdef, params, s: st.WriteState, spec: WriteSpec) -> st.WriteState:
    """`step.run_writes` until every row has stopped, the cache in its stacked form before and after."""
    model = merge(graphdef, params)
    s, _ = run_writes(model, spec, s.replace(cache=layered(s.cache, model)), s.status_B.shape[0] + 1)
    return s.replace(cache=stacked(s.cache))


def initial_state(cache, logits_BxV: jax.Array, n_active, spec: WriteSpec) -> st.WriteState:
    """The `WriteState` of freshly prefilled rows: rows from `n_active` on are batch padding (IDLE). Every per-row
    field starts here, so a row refilled with this state (`refill`) keeps nothing of the call it replaces."""
    B = logits_BxV.shape[0]
    return st.WriteState(
        cache=cache, logits_BxV=logits_BxV, out_BxT=jnp.zeros((B, spec.max_new_tokens), jnp.int32),
        logp_BxT=jnp.zeros((B, spec.max_new_tokens)),
        n_out_B=jnp.zeros(B, jnp.int32), status_B=jnp.where(jnp.arange(B) < n_active, st.RUNNING, st.IDLE),
        sum_logp_B=jnp.zeros(B), best_score_B=jnp.full(B, -jnp.inf), best_cut_B=jnp.full(B, -1, jnp.int32),
        n_cuts_B=jnp.zeros(B, jnp.int32), no_improve_B=jnp.zeros(B, jnp.int32),
        bans=None if spec.bans is None else item_bans.init_bans(cache.lengths_B, spec.bans.max_bans))


@functools.partial(jax.jit, static_argnames=("graphdef", "spec"))
def _start_and_loop(graphdef, params, cache, logits_BxV, n_active, spec: WriteSpec) -> st.WriteState:
    """`initial_state` and `write_loop` in one dispatch (building the state on the host costs a transfer per
    field)."""
    return write_loop(graphdef, params, initial_state(cache, logits_BxV, n_active, spec), spec)


def write_spec(tokenizer, decoding: WriteDecoding, max_len: int) -> WriteSpec:
    """The loop's settings for `decoding` with a cache of `max_len` slots."""
    return WriteSpec(**{f.name: getattr(decoding, f.name) for f in dataclasses.fields(WriteDecoding)},
                     close_id=tokenizer.marker_id[protocol.CALL_END], eos_id=tokenizer.eos_id, max_len=max_len)


def prefill_prompts(graphdef, params, make_cache, max_len: int, vocab: int, rows: Sequence[Sequence[int]],
                    n_active: int, share_prefixes: bool):
    """A cache of `len(rows)` rows holding the prompts `rows[:n_active]` (later rows empty), and each row's
    next-token logits; `share_prefixes`: through `prefill.prefill_shared`."""
    if share_prefixes:
        return prefill_shared(graphdef, params, make_cache, max_len, vocab, rows, n_active=n_active)
    B = len(rows)
    return prefill(graphdef, params, make_cache(B, max_len), jnp.zeros((B, vocab)),
                   [r if b < n_active else [] for b, r in enumerate(rows)])


def host_rows(s: st.WriteState) -> tuple[np.ndarray, ...]:
    """The fields a row's result is read from (`row_results`), fetched in one device-to-host transfer."""
    return tuple(np.asarray(x) for x in jax.device_get((s.out_BxT, s.logp_BxT, s.n_out_B, s.best_cut_B,
                                                         s.best_score_B, s.n_cuts_B, s.status_B)))


def row_results(tokenizer, spec: WriteSpec, fields: tuple[np.ndarray, ...], rows: Iterable[int]) -> list[dict]:
    """The results of rows `rows`, from `host_rows` of the final state."""
    out, logp, n, cut, score, n_cuts, status = fields
    mem_write = tokenizer.marker_id[protocol.MEM_WRITE]
    results = []
    for b in rows:
        n_body = cut[b] if cut[b] >= 0 else n[b]
        body = out[b, :n_body].tolist()
        text = tokenizer.decode([mem_write] + body + ([spec.close_id] if cut[b] >= 0 else []))
        results.append({"ids": body, "logps": logp[b, :n_body].tolist(), "text": text, "cut": int(cut[b]),
                        "score": float(score[b]), "n_cuts": int(n_cuts[b]), "n_generated": int(n[b]),
                        "stop": st.STATUS_NAMES[int(status[b])]})
    return results


def decode_writes(model, tokenizer, prompt_ids: Sequence[Sequence[int]], decoding: WriteDecoding = WriteDecoding(), *,
                  make_cache=None, pad_to: int | None = None, share_prefixes: bool = True, split=None) -> list[dict]:
    """Decode the write call after each prompt (which ends with `({MEM_WRITE-->`) as `decoding` says (late
    stopping, item bans: `WriteDecoding`). Returns per prompt the body tokens up to
    the chosen cut (`ids`), their log-probabilities, the call text, the cut points and the stop reason.

    `share_prefixes`: prompts sharing a token prefix (one document's pretext) prefill it once
    (`prefill.prefill_shared`). `split`: `split_model(model)` when the caller already has it. A stream of more
    prompts than one batch: `refill.refill_writes`."""
    B = len(prompt_ids)
    if B == 0:
        return []
    graphdef, params = split_model(model) if split is None else split
    rows = [list(p) for p in prompt_ids] + [[tokenizer.bos_id]] * max(0, (pad_to or B) - B)
    max_len = cache_slots(max(len(p) for p in rows), decoding.max_new_tokens)
    make_cache = cache_factory(model) if make_cache is None else make_cache
    cache, logits = prefill_prompts(graphdef, params, make_cache, max_len, vocab_size(model, tokenizer), rows, B,
                                    share_prefixes)
    spec = write_spec(tokenizer, decoding, max_len)
    s = _start_and_loop(graphdef, params, cache, logits, jnp.int32(B), spec)
    return row_results(tokenizer, spec, host_rows(s), range(B))


def item_confidences(tokenizer, body_ids: Sequence[int], logps: Sequence[float]) -> dict[protocol.Triple, float]:
    """How sure the model was of each triple it wrote: the lowest log-probability among the tokens that wrote the
    item, counting the token that opened it (the choice to write another item rather than close the call).

    `body_ids` / `logps`: a `decode_writes` result's `ids` / `logps` (the call body after `({MEM_WRITE-->`). Items
    that do not parse are left out; a triple written twice keeps its higher confidence. Never raises."""
    try:
        ends = [len(tokenizer.decode(list(body_ids[:i + 1]))) for i in range(len(body_ids))]  # token i's text end
        starts = [0] + ends[:-1]
        body = tokenizer.decode(list(body_ids))
        out: dict[protocol.Triple, float] = {}
        for a, b in protocol.unescaped_spans(body, protocol.ITEM_SEP):
            item = protocol.parse_triples(body[a:b]).items
            lp = [logps[i] for i in range(len(body_ids)) if ends[i] > max(a - 1, 0) and starts[i] < b]
            if len(item) == 1 and lp:
                out[item[0]] = max(out.get(item[0], -float("inf")), min(lp))
        return out
    except Exception:  # noqa: BLE001 - model output is untrusted
        return {}
