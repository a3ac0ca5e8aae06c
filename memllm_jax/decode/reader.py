"""The memory-read controller (paper §3.2): batched generation that pauses rows at `)-->`, answers every
paused row with one batched memory call, prefills `e1;e2})` into the same KV cache and resumes.

A call is removed from the context when its result is empty, when it has more than Q_thr entities, when its
queries do not parse, or when the model later opens a new call. Removal rewinds the row's cache to just
before the call (`lengths_B`), then re-feeds the token before the call plus whatever followed the call, so
the cache and next-token logits are those of a context in which the call never happened; nothing before the
call is recomputed. After a removal at the current point, the next token may not reopen a call there.
An identical repeated query set is answered from the row's earlier result, not re-run.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from memllm_jax import protocol
from memllm_jax.decode import state as st
from memllm_jax.decode.loop import LoopSpec, host, prefill, read_chunk, split_model
from memllm_jax.decode.sampling import GREEDY, SamplingConfig


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
class GenerationResult:
    prompt_ids: list[int]
    token_ids: list[int]
    """Generated tokens as they stand in the final context (kept calls and their results included)."""
    text: str
    """`token_ids` decoded, markers as strings."""
    plain_text: str
    """`text` with every call removed and unescaped."""
    calls: list[ApiCall]
    finish_reason: str
    n_generated: int
    """Tokens the model generated, including those of removed calls."""


@dataclasses.dataclass
class _Row:
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


def _merge(results: Sequence[Any], q_thr: int) -> tuple[tuple[str, ...], bool]:
    entities: list[str] = []
    too_large = False
    for r in results:
        too_large |= bool(r.too_large)
        for e in r.entities:
            if e not in entities:
                entities.append(e)
    return tuple(entities), too_large or len(entities) > q_thr


class ReadController:
    """Drives `read_chunk` and the host-side memory round trips for one batch of prompts."""

    def __init__(self, model, tokenizer, memory, *, max_len: int, chunk: int = 32,
                 sampling: SamplingConfig = GREEDY, q_thr: int | None = None, seed: int = 0):
        self.tok, self.memory = tokenizer, memory
        self.graphdef, self.params = split_model(model)
        ids = tokenizer.marker_id
        self.open_id, self.end_id = ids[protocol.MEM_READ], ids[protocol.READ_END]
        self.close_id = ids[protocol.CALL_END]
        self.q_thr = q_thr if q_thr is not None else getattr(getattr(memory, "config", None), "q_thr", 30)
        self.spec = LoopSpec(chunk=chunk, eos_id=tokenizer.eos_id, read_open_id=self.open_id,
                             read_end_id=self.end_id, max_len=max_len, sampling=sampling,
                             pad_id=int(getattr(tokenizer, "pad_id", 0) or 0))
        self.max_len = max_len
        self.seed = seed
        self.memory_calls = 0

    # ------------------------------------------------------------------------------------------ public

    def run(self, prompt_ids: Sequence[Sequence[int]], max_new_tokens: int, init_cache) -> list[GenerationResult]:
        B = len(prompt_ids)
        rows = [_Row(ctx=list(p), prompt_len=len(p)) for p in prompt_ids]
        for r in rows:
            if not r.ctx:
                raise ValueError("generate: empty prompt (it needs at least a BOS token)")
            if len(r.ctx) >= self.max_len:
                raise ValueError(f"generate: prompt of {len(r.ctx)} tokens does not fit max_len={self.max_len}")
        cache = init_cache(B, self.max_len)
        V = self.tok.vocab_size
        cache, logits = prefill(self.graphdef, self.params, cache, jnp.zeros((B, V), jnp.float32),
                                [r.ctx for r in rows], self.spec.pad_id)
        status = np.full(B, st.RUNNING, np.int32)
        budget = np.full(B, max_new_tokens, np.int32)
        in_call = np.zeros(B, bool)
        for b, r in enumerate(rows):
            in_call[b], awaiting = self._scan_prompt(r)
            if awaiting:
                status[b] = st.READ_PAUSE
        s = st.DecodeState(
            cache=cache, logits_BxV=logits, out_BxC=jnp.zeros((B, self.spec.chunk), jnp.int32),
            n_out_B=jnp.zeros(B, jnp.int32), status_B=jnp.asarray(status), budget_B=jnp.asarray(budget),
            in_call_B=jnp.asarray(in_call), active_call_B=jnp.asarray([r.active is not None for r in rows]),
            ban_read_B=jnp.zeros(B, bool), rng=jax.random.PRNGKey(self.seed))
        if max_new_tokens <= 0:
            status[:] = st.IDLE
            for r in rows:
                r.finish = "budget"
        s = s.replace(status_B=jnp.asarray(status))
        while True:
            s = self._handle_pauses(s, rows)
            if not np.any(host(s.status_B) == st.RUNNING):
                break
            s = read_chunk(self.graphdef, self.params, s, self.spec)
            self._collect(s, rows)
        return [self._result(r) for r in rows]

    # ----------------------------------------------------------------------------------------- internals

    def _scan_prompt(self, r: _Row) -> tuple[bool, bool]:
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

    def _collect(self, s: st.DecodeState, rows: list[_Row]) -> None:
        out, n_out = host(s.out_BxC), host(s.n_out_B)
        for b, r in enumerate(rows):
            for t in out[b, : n_out[b]].tolist():
                r.ctx.append(t)
                r.n_generated += 1
                if t == self.open_id:
                    r.call_start_prev = r.call_start
                    r.call_start = len(r.ctx) - 1

    def _handle_pauses(self, s: st.DecodeState, rows: list[_Row]) -> st.DecodeState:
        status, budget = host(s.status_B).copy(), host(s.budget_B)
        in_call, active, ban = host(s.in_call_B).copy(), host(s.active_call_B).copy(), np.zeros(len(rows), bool)
        lengths = host(s.cache.lengths_B).copy()
        feed: list[list[int]] = [[] for _ in rows]
        pending: list[tuple[int, ApiCall, tuple]] = []
        for b, r in enumerate(rows):
            code = int(status[b])
            if code == st.OPEN_PAUSE:
                self._remove_previous(r, b, lengths, feed)
                active[b], in_call[b] = False, True
                status[b] = st.RUNNING
            elif code == st.READ_PAUSE:
                text = self.tok.decode(r.ctx[r.call_start:])
                parsed = protocol.parse_read_call(text)
                call = ApiCall(query_text=text, queries=tuple(parsed.items), errors=parsed.errors)
                r.calls.append(call)
                in_call[b] = False
                if parsed.errors or not parsed.items:
                    self._drop_current(r, b, call, "malformed", lengths, feed, ban)
                elif call.queries in r.seen:
                    call.repeated = True
                    self._apply(r, b, call, r.seen[call.queries], lengths, feed, ban, active)
                else:
                    pending.append((b, call, call.queries))
                status[b] = st.RUNNING
            elif code in (st.EOS, st.BUDGET, st.FULL):
                r.finish = st.STATUS_NAMES[code]
                if r.call_start is not None and in_call[b]:
                    r.calls.append(ApiCall(query_text=self.tok.decode(r.ctx[r.call_start:]), removed=True,
                                           reason="truncated", complete=False))
                status[b] = st.IDLE
        if pending:
            flat = [q for _, _, qs in pending for q in qs]
            results = self.memory.query(flat)
            self.memory_calls += 1
            k = 0
            for b, call, qs in pending:
                answer = _merge(results[k : k + len(qs)], self.q_thr)
                k += len(qs)
                rows[b].seen[qs] = answer
                self._apply(rows[b], b, call, answer, lengths, feed, ban, active)
        for b, r in enumerate(rows):
            if status[b] == st.RUNNING and (budget[b] <= 0 or len(r.ctx) >= self.max_len):
                r.finish = "budget" if budget[b] <= 0 else "cache_full"
                status[b] = st.IDLE
        cache, logits = s.cache.replace(lengths_B=jnp.asarray(lengths)), s.logits_BxV
        if any(feed):
            cache, logits = prefill(self.graphdef, self.params, cache, logits, feed, self.spec.pad_id)
        return s.replace(cache=cache, logits_BxV=logits, status_B=jnp.asarray(status),
                         in_call_B=jnp.asarray(in_call), active_call_B=jnp.asarray(active),
                         ban_read_B=jnp.asarray(ban), n_out_B=jnp.zeros_like(s.n_out_B))

    def _apply(self, r: _Row, b: int, call: ApiCall, answer, lengths, feed, ban, active) -> None:
        entities, too_large = answer
        if too_large or not entities:
            self._drop_current(r, b, call, "too_large" if too_large else "empty", lengths, feed, ban)
            return
        answer_ids = self.tok.encode(protocol.format_read_result(entities))
        if len(r.ctx) + len(answer_ids) >= self.max_len:
            self._drop_current(r, b, call, "cache_full", lengths, feed, ban)
            return
        call.result = entities
        r.ctx.extend(answer_ids)
        feed[b].extend(answer_ids)
        r.active, r.active_call, r.call_start = (r.call_start, len(r.ctx)), call, None
        active[b] = True

    def _drop_current(self, r: _Row, b: int, call: ApiCall, reason: str, lengths, feed, ban) -> None:
        """Remove the just-closed call: rewind to before it and re-feed the token preceding it."""
        call.removed, call.reason = True, reason
        start = r.call_start
        del r.ctx[start:]
        r.call_start = None
        self._rewind(r, b, start, lengths, feed)
        ban[b] = True

    def _remove_previous(self, r: _Row, b: int, lengths, feed) -> None:
        """The model opened a new call (the last ctx token): remove the earlier call still in the context."""
        new_open = len(r.ctx) - 1
        prev = r.call_start_prev
        if prev is not None and prev < new_open and (r.active is None or prev >= r.active[1]):
            span, call = (prev, new_open), ApiCall(query_text=self.tok.decode(r.ctx[prev:new_open]), complete=False)
            r.calls.append(call)  # an unfinished call interrupted by a new one
        elif r.active is not None:
            span, call = r.active, r.active_call
        else:
            return
        call.removed, call.reason = True, "new_call"
        s, e = span
        r.ctx = r.ctx[:s] + r.ctx[e:]
        r.active, r.active_call, r.call_start_prev = None, None, None
        r.call_start = len(r.ctx) - 1
        self._rewind(r, b, s, lengths, feed)

    def _rewind(self, r: _Row, b: int, start: int, lengths, feed) -> None:
        keep = max(start - 1, 0)
        lengths[b] = keep
        feed[b][:] = r.ctx[keep:]

    def _result(self, r: _Row) -> GenerationResult:
        ids = r.ctx[r.prompt_len :]
        text = self.tok.decode(ids)
        return GenerationResult(prompt_ids=r.ctx[: r.prompt_len], token_ids=ids, text=text,
                                plain_text=protocol.strip_calls(text), calls=r.calls,
                                finish_reason=r.finish or "budget", n_generated=r.n_generated)


def _cache_factory(model):
    if hasattr(model, "make_cache"):
        return model.make_cache
    from memllm_jax.model.mistral import init_cache

    return lambda batch, max_len: init_cache(model.cfg, batch, max_len)


def encode_prompt(tokenizer, prompt: str | Sequence[int], *, force_read: bool = False,
                  gold_queries: Sequence[protocol.Query] | None = None) -> list[int]:
    """BOS + the escaped prompt text (or the given ids as they are), then optionally an opened read call
    (`force_read`) or a complete query part `({MEM_READ(q1;q2)-->` (`gold_queries`) the memory answers
    before generation starts."""
    ids = list(prompt) if not isinstance(prompt, str) else [tokenizer.bos_id] + tokenizer.encode(protocol.escape_text(prompt))
    if gold_queries:
        ids += tokenizer.encode(protocol.format_read_call(gold_queries))
    elif force_read:
        ids.append(tokenizer.marker_id[protocol.MEM_READ])
    return ids


def generate_with_memory(model, tokenizer, memory, prompts: Sequence[str | Sequence[int]], max_new_tokens: int = 64, *,
                         sampling: SamplingConfig = GREEDY, chunk: int = 32, max_len: int | None = None,
                         batch_size: int = 16, force_read: bool | Sequence[bool] = False,
                         gold_queries: Sequence[Sequence[protocol.Query] | None] | None = None,
                         q_thr: int | None = None, seed: int = 0) -> list[GenerationResult]:
    """Generate a continuation of each prompt with memory reads (paper §3.2), `batch_size` rows at a time.

    Text prompts are escaped (so they cannot trigger memory operations) and get a BOS; token-id prompts are
    used as they are. `force_read` opens a read call right after the prompt; `gold_queries` supplies the
    queries of that call, answered before generation starts.
    """
    n = len(prompts)
    forced = [force_read] * n if isinstance(force_read, bool) else list(force_read)
    gold = list(gold_queries) if gold_queries is not None else [None] * n
    ids = [encode_prompt(tokenizer, p, force_read=f, gold_queries=g) for p, f, g in zip(prompts, forced, gold)]
    if max_len is None:
        need = max(len(x) for x in ids) + max_new_tokens + 64
        max_len = -(-need // 128) * 128
    controller = ReadController(model, tokenizer, memory, max_len=max_len, chunk=chunk, sampling=sampling,
                                q_thr=q_thr, seed=seed)
    make_cache = _cache_factory(model)
    out: list[GenerationResult] = []
    for i in range(0, n, batch_size):
        out += controller.run(ids[i : i + batch_size], max_new_tokens, make_cache)
    return out
