"""Host-side bookkeeping of memory-read calls, shared by both ways of serving reads (`reader.ReadController`
with `reads="host"` at loop exits, or `reads="in_loop"` from a callback inside the jitted loop).

Each row's context is mirrored on the host (`Row.ctx`); `CallBook` parses a closed call, queries the memory
(one batched query for all rows closing a call together), formats the answer, refuses empty / too large /
malformed results, and removes calls (paper §3.2). It never touches the device: it edits the mirrors and
fills, per row, the cache length to rewind to (`lengths`) and the tokens to feed next (`feed`); the caller
turns those into a prefill (host path) or forced tokens (in-loop path).

A call is removed from the context when its result is empty (unless `keep_empty`: memory-aware reading, where
the call stays closed with nothing, `protocol.format_empty_read`), when it has more than Q_thr entities, when its
queries do not parse, or when the model later opens a new call (unless `keep_reads`: a complete call then stays,
so a later read can use an earlier one's result, e.g. a two-hop question). Removal rewinds the row's cache to just
before the call, then re-feeds the token before the call plus whatever followed the call, so the cache and
next-token logits are those of a context in which the call never happened; nothing before the call is
recomputed. After a removal at the current point, the next token may not reopen a call there. An identical
repeated query set is answered from the row's earlier result, not re-run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from memllm_jax import protocol


@dataclasses.dataclass
class ApiCall:
    """One memory-read call the model made."""

    query_text: str
    """The call as generated, `({MEM_READ(...)-->` (or the truncated part)."""
    queries: tuple[protocol.Query, ...] = ()
    result: tuple[str, ...] = ()
    """Entities returned (empty when nothing matched or the set was too large)."""
    removed: bool = False
    reason: str = ""
    """Why it was removed: "empty", "too_large", "malformed", "new_call"; "truncated" when generation ended
    inside the call; "" when it stayed in the context."""
    repeated: bool = False
    """Answered from an identical earlier call of the same row (no memory query)."""
    errors: tuple[str, ...] = ()
    complete: bool = True
    """False when the token budget or the cache ended generation inside the call."""


@dataclasses.dataclass
class Row:
    """The host's mirror of one batch row."""

    ctx: list[int]
    prompt_len: int
    call_start: int | None = None
    """Index in ctx of the open call's `({MEM_READ(` token."""
    call_start_prev: int | None = None
    """The open call's start when a newer `({MEM_READ(` arrived (an unfinished call it interrupts)."""
    active: tuple[int, int] | None = None
    """Span in ctx of the last call still in the context."""
    active_call: ApiCall | None = None
    seen: dict = dataclasses.field(default_factory=dict)
    calls: list[ApiCall] = dataclasses.field(default_factory=list)
    finish: str = ""
    n_generated: int = 0
    kinds: list[str] = dataclasses.field(default_factory=list)
    """Per ctx token: "p" prompt, "g" generated, "a" answer fed by the host."""
    banned_next: bool = False
    trace: list | None = None
    """With `trace=True`: (context before the token, token, reopening banned) per generated token."""
    synced: int = 0
    """Tokens of the current chunk's `out_BxC` already appended to `ctx` (the in-loop path syncs a row
    when it closes or opens a call, the rest at the loop exit)."""


def merge_results(results: Sequence[Any], q_thr: int | None = None) -> tuple[tuple[str, ...], bool]:
    """(entities in first-seen order, too large) for the results of one call's queries: too large when a query
    matched too many (its entities are not taken) or the call's entities number more than `q_thr`. Generation
    (`CallBook`) then removes the call; Table 2's reads (`eval.perplexity`) keep what the other queries found."""
    entities: list[str] = []
    too_large = False
    for r in results:
        if r.too_large:  # an exact match over q_thr may leave the entities of the nearest-neighbour search
            too_large = True
            continue
        for e in r.entities:
            if e not in entities:
                entities.append(e)
    return tuple(entities), too_large or (q_thr is not None and len(entities) > q_thr)


@dataclasses.dataclass(frozen=True)
class _Refused:
    """The memory refused a query's names (e.g. an over-long name from model output): it finds nothing."""

    entities: tuple = ()
    too_large: bool = False


def query_untrusted(memory, queries: Sequence[protocol.Query]) -> list[Any]:
    """One batched query; if the memory refuses some names (ValueError), retry one by one so only those fail."""
    try:
        return list(memory.query(queries))
    except ValueError:
        out: list[Any] = []
        for q in queries:
            try:
                out.append(memory.query([q])[0])
            except ValueError:
                out.append(_Refused())
        return out


class CallBook:
    """The call logic on the rows' host mirrors. `lengths` (cache lengths), `feed` (tokens to feed per row),
    `ban` (the next token may not open a call), `active` and `in_call` are per-row arrays the caller passes
    in and reads back."""

    def __init__(self, tokenizer, memory, *, q_thr: int, max_len: int, keep_empty: bool = False,
                 keep_reads: bool = False):
        self.tok, self.memory, self.q_thr, self.max_len = tokenizer, memory, q_thr, max_len
        self.keep_empty = keep_empty
        """An empty result is answered `})` and the call kept, so the model sees that the memory had nothing."""
        self.keep_reads = keep_reads
        """A complete call stays in the context when the model opens the next one (the paper removes it)."""
        self.row_memories: Sequence[Any] | None = None
        """One memory per row of the batch (e.g. one edit's memory per question), or None: `memory` for all."""
        ids = tokenizer.marker_id
        self.open_id, self.end_id = ids[protocol.MEM_READ], ids[protocol.READ_END]
        self.close_id = ids[protocol.CALL_END]
        self.memory_calls = 0
        """Batched memory queries made."""

    def scan_prompt(self, r: Row) -> tuple[bool, bool]:
        """Find calls in a pre-tokenized prompt (forced reads, gold queries, kept calls).
        Returns (inside an open call, the open call's queries are complete and await an answer)."""
        in_call = awaiting = False
        for i, t in enumerate(r.ctx):
            if t == self.open_id:
                r.call_start, in_call, awaiting = i, True, False
            elif t == self.end_id and in_call:
                in_call, awaiting = False, True
            elif t == self.close_id and awaiting:
                r.active, r.call_start, awaiting = (r.call_start, i + 1), None, False
        return in_call, awaiting and r.ctx[-1] == self.end_id

    def append_generated(self, r: Row, tokens: Sequence[int]) -> None:
        """Tokens the model generated, in order."""
        for t in tokens:
            if r.trace is not None:
                r.trace.append((tuple(r.ctx), t, r.banned_next))
            r.banned_next = False
            r.ctx.append(t)
            r.kinds.append("g")
            r.n_generated += 1
            if t == self.open_id:
                r.call_start_prev = r.call_start
                r.call_start = len(r.ctx) - 1

    def close_calls(self, rows: list[Row], closed: Sequence[int], lengths, feed, ban, active) -> None:
        """Rows `closed` just generated `)-->`: parse each call, answer all of them with one batched memory
        query (malformed and repeated calls need none), then keep or remove each call."""
        pending: list[tuple[int, ApiCall, tuple]] = []
        for b in closed:
            r = rows[b]
            text = self.tok.decode(r.ctx[r.call_start:])
            parsed = protocol.parse_read_call(text)
            call = ApiCall(query_text=text, queries=tuple(parsed.items), errors=parsed.errors)
            r.calls.append(call)
            if parsed.errors or not parsed.items:
                self._drop_current(r, b, call, "malformed", lengths, feed, ban)
            elif call.queries in r.seen:
                call.repeated = True
                self._apply(r, b, call, r.seen[call.queries], lengths, feed, ban, active)
            else:
                pending.append((b, call, call.queries))
        if not pending:
            return
        if self.row_memories is None:
            results = query_untrusted(self.memory, [q for _, _, qs in pending for q in qs])
        else:
            results = [res for b, _, qs in pending for res in query_untrusted(self.row_memories[b], qs)]
        self.memory_calls += 1
        k = 0
        for b, call, qs in pending:
            answer = merge_results(results[k : k + len(qs)], self.q_thr)
            k += len(qs)
            rows[b].seen[qs] = answer
            self._apply(rows[b], b, call, answer, lengths, feed, ban, active)

    def remove_previous(self, r: Row, b: int, lengths, feed) -> None:
        """The model opened a new call (the last ctx token): remove the earlier call still in the context."""
        new_open = len(r.ctx) - 1
        prev = r.call_start_prev
        if prev is not None and prev < new_open and (r.active is None or prev >= r.active[1]):
            span, call = (prev, new_open), ApiCall(query_text=self.tok.decode(r.ctx[prev:new_open]), complete=False)
            r.calls.append(call)  # an unfinished call interrupted by a new one
        elif r.active is not None and r.active_call is None:
            # A complete call that came with the prompt (e.g. a few-shot example) is the caller's context: kept.
            r.active, r.call_start_prev = None, None
            return
        elif r.active is not None:
            span, call = r.active, r.active_call
        else:
            return
        call.removed, call.reason = True, "new_call"
        s, e = span
        r.ctx = r.ctx[:s] + r.ctx[e:]
        r.kinds = r.kinds[:s] + r.kinds[e:]
        r.active, r.active_call, r.call_start_prev = None, None, None
        r.call_start = len(r.ctx) - 1
        self._rewind(r, b, s, lengths, feed)

    def truncate(self, r: Row) -> None:
        """Generation ended inside the open call: record it as truncated."""
        if r.call_start is not None:
            r.calls.append(ApiCall(query_text=self.tok.decode(r.ctx[r.call_start:]), removed=True,
                                   reason="truncated", complete=False))

    # ----------------------------------------------------------------------------------------- internals

    def _apply(self, r: Row, b: int, call: ApiCall, answer, lengths, feed, ban, active) -> None:
        entities, too_large = answer
        if too_large or not (entities or self.keep_empty):
            self._drop_current(r, b, call, "too_large" if too_large else "empty", lengths, feed, ban)
            return
        answer_ids = self.tok.encode(protocol.format_read_result(entities))
        if len(r.ctx) + len(answer_ids) >= self.max_len:
            self._drop_current(r, b, call, "cache_full", lengths, feed, ban)
            return
        call.result = entities
        r.ctx.extend(answer_ids)
        r.kinds.extend("a" * len(answer_ids))
        feed[b].extend(answer_ids)
        if self.keep_reads:  # it stays when the next call opens: nothing to remove, so no pause for it
            r.call_start = None
            return
        r.active, r.active_call, r.call_start = (r.call_start, len(r.ctx)), call, None
        active[b] = True

    def _drop_current(self, r: Row, b: int, call: ApiCall, reason: str, lengths, feed, ban) -> None:
        """Remove the just-closed call: rewind to before it and re-feed the token preceding it."""
        call.removed, call.reason = True, reason
        start = r.call_start
        del r.ctx[start:]
        del r.kinds[start:]
        r.call_start = None
        self._rewind(r, b, start, lengths, feed)
        ban[b] = r.banned_next = True

    def _rewind(self, r: Row, b: int, start: int, lengths, feed) -> None:
        keep = max(start - 1, 0)
        lengths[b] = keep
        feed[b][:] = r.ctx[keep:]

