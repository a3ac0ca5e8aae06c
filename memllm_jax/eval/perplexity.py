"""Table 2: OVERALL / TARGET / ENTITY perplexity with memory reads (paper §4.2), batched across documents.

One forward scores a document without any read. Each read then costs one forward over
BOS + text before the read + the read call and its result + the text from the read position on (up to the
next gold read when positions are gold). With model-chosen positions the next read is the first later
position whose most likely token (in the current path context) is `({MEM_READ(`; documents advance in
rounds, each round one forward per document that still reads, batched. Such a forward covers only the
next `ReadSetting.window` text tokens: when no read position lies among them, the next round scores the same
read again over twice as many (a causal model's scores of a prefix do not depend on what follows, so this
gives the scores of one forward to the end, at a fraction of the tokens when reads are close together).
Token probabilities are then combined with the paper's mixture (see `mixture.py` for exactly which context
each token is scored in).

A read's call is `({MEM_READ(` + queries + `)-->`; its result is the merged entities of every query whose
result set is neither empty nor too large, then `})`. A read whose result is empty is removed (paper §3.2),
so its branch is the text context alone. When a new read starts, the previous one is removed first, so a
read's queries are generated from the text alone.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Sequence

import numpy as np

from memllm_jax import protocol
from memllm_jax.decode.calls import merge_results, query_untrusted
from memllm_jax.runtime.compiled_code import release_if_many_mappings
from memllm_jax.eval.mixture import SpanNLL, corpus_perplexities, mix_logprobs, span_nll
from memllm_jax.eval.records import EncodedDoc
from memllm_jax.eval.scoring import GreedyGenerator, ModelWork, Scorer
from memllm_jax.eval.trace import doc_trace, read_event

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ReadSetting:
    """How memory reads are made for one Table 2 row."""

    positions: str = "model"
    """"none" (no reads: baselines), "model" (where the model's argmax is the read token) or "gold"."""
    queries: str = "model"
    """"model" (generated greedily after the read token) or "gold"."""
    results: str = "memory"
    """"memory", "memory+gold" (the gold target appended when missing, ⑧) or "gold_only" (⑨)."""
    read_threshold: float | None = None
    """With model positions: read where p(MR) >= this instead of where MR is the argmax."""
    max_reads: int = 64
    """Most reads per document with model positions (a guard against a model that reads everywhere)."""
    max_query_tokens: int = 64
    """Most generated tokens for one read call's queries."""
    window: int = 32
    """With model positions: text tokens a read's forward scores at first (doubled until the next read position
    or the document's end is covered); 0 scores to the end at once."""


@dataclasses.dataclass
class _DocState:
    enc: EncodedDoc
    logp_path: np.ndarray
    logp_mr: np.ndarray
    logp_read: np.ndarray
    read: np.ndarray
    cursor: int = 0
    n_reads: int = 0
    n_nonempty: int = 0
    n_target_hit: int = 0
    query_checks: dict = dataclasses.field(default_factory=lambda: dict.fromkeys(QUERY_CHECKS, 0))
    active: bool = True
    forward: Any = None
    forward_shift: int = 0
    covered: int = 0
    """`forward` scores text tokens up to (not including) this one."""
    last_read: Any = None
    """The read whose forward is `forward` (None: the plain forward)."""
    events: list | None = None
    """Traced documents only: one `trace.read_event` per read."""


QUERY_CHECKS = ("gold_position_reads", "query_entity_correct", "query_relation_correct", "query_exact")
"""Counted at gold read positions when the model writes the queries: reads there, and reads where one of the
model's queries names a gold query's entity, its relation, or equals a gold query (case-insensitively)."""


def _query_key(q: protocol.Query) -> tuple[str, str, str]:
    return tuple(" ".join((x or "").split()).lower() for x in (q.subject, q.relation, q.object))  # type: ignore


def check_queries(generated: Sequence[protocol.Query], gold: Sequence[protocol.Query]) -> dict[str, int]:
    """One read's QUERY_CHECKS (1 / 0 each) for the model's `generated` queries against the `gold` ones."""
    gen, ref = [_query_key(q) for q in generated], [_query_key(q) for q in gold]
    entities = {s or o for s, _, o in ref}
    return {"gold_position_reads": 1,
            "query_entity_correct": int(any((s or o) in entities for s, _, o in gen)),
            "query_relation_correct": int(any(r in {g[1] for g in ref} for _, r, _ in gen)),
            "query_exact": int(any(g in ref for g in gen))}


@dataclasses.dataclass
class _Read:
    state: _DocState
    pos: int
    gold: Any  # GoldRead or None
    queries: tuple = ()
    call_ids: list = dataclasses.field(default_factory=list)
    result_ids: list = dataclasses.field(default_factory=list)
    end: int = 0
    """The last text token its forward scores."""
    extends: bool = False
    """The document's last read scored again over more text (no new call, query or result)."""


@dataclasses.dataclass
class PerplexityResult:
    ppl: dict[str, float]
    nll: SpanNLL
    stats: dict[str, float]
    per_doc: list[dict]
    traces: list[dict] = dataclasses.field(default_factory=list)
    """`trace.doc_trace` of the first `trace_docs` documents (not in `to_json`)."""
    work: ModelWork = dataclasses.field(default_factory=ModelWork)
    """What the scoring and the query generation ran through the model (not in `to_json`)."""

    def to_json(self) -> dict:
        return {"ppl": self.ppl, "nll": self.nll.nll, "count": self.nll.count, "stats": self.stats}


def read_scorer(model: Any, tok: Any, batch_size: int = 8) -> Scorer:
    """`model`'s Scorer for `evaluate_perplexity` (its `scorer`, to share it across calls)."""
    return Scorer(model, tok.marker_id[protocol.MEM_READ], batch_size=batch_size, pad_id=tok.pad_id)


def evaluate_perplexity(model: Any, tok: Any, docs: Sequence[EncodedDoc], memory: Any, setting: ReadSetting,
                        *, batch_size: int = 8, query_batch: int | None = None,
                        progress: Callable[[str], None] | None = None, trace_docs: int = 0,
                        scorer: Scorer | None = None) -> PerplexityResult:
    """Perplexities of `model` on `docs` with reads answered by `memory` (a TripleMemory, or None).

    `trace_docs`: for the first that many documents also return a read trace (`eval.trace`): every read's call,
    queries, results and fate, and each token's loss with these reads and without any (the plain forward).
    `scorer`: `model`'s Scorer (`batch_size` rows) shared by several calls, which then trace and compile each shape
    and run the plain forward of the same documents once; its `work` is reset to count this call's.
    `query_batch`: rows of the greedy query generation (None: `batch_size`)."""
    mr_id = tok.marker_id[protocol.MEM_READ]
    read_end_id = tok.marker_id[protocol.READ_END]
    scorer = read_scorer(model, tok, batch_size) if scorer is None else scorer
    scorer.work = ModelWork()
    generator = None
    if setting.positions != "none" and setting.queries == "model":
        generator = GreedyGenerator(model, batch_size=query_batch or batch_size, pad_id=tok.pad_id)

    states = []
    plain = scorer.score([[tok.bos_id] + e.ids for e in docs], keep_kv=True)
    for e, f in zip(docs, plain):
        T = len(e.ids)
        states.append(_DocState(e, f.lp_next[:T].copy(), f.lp_mr[:T].copy(), np.zeros(T), np.zeros(T, bool),
                                forward=f, forward_shift=0, covered=T, events=[] if len(states) < trace_docs else None))
    logp_plain = [s.logp_path.copy() for s in states[:trace_docs]]
    plain_by_id = {id(s): f for s, f in zip(states, plain)}
    if setting.positions == "none":
        for s in states:
            s.active = False

    round_no = 0
    while any(s.active for s in states):
        round_no += 1
        reads: list[_Read] = []
        for s in states:
            if not s.active:
                continue
            new = _next_reads(s, setting, mr_id)
            if not new:
                s.active = False
            reads += new
        if not reads:
            break
        extensions = [r for r in reads if r.extends]
        reads = [r for r in reads if not r.extends]
        # Queries.
        need_gen = [r for r in reads if setting.queries == "model"]
        if need_gen:
            prefixes = [[tok.bos_id] + r.state.enc.ids[:r.pos] + [mr_id] for r in need_gen]
            kept = [(plain_by_id[id(r.state)].kv, 1 + r.pos) for r in need_gen] if scorer.keeps_kv else None
            outs = generator.generate(prefixes, [read_end_id, tok.eos_id], setting.max_query_tokens, kept=kept)
            for r, out in zip(need_gen, outs):
                if out and out[-1] == read_end_id:
                    parsed = protocol.parse_queries(tok.decode(out[:-1]))
                    r.queries = tuple(parsed.items)
                    r.call_ids = [mr_id] + out
        for r in reads:
            if setting.queries == "gold":
                r.queries = tuple(r.gold.queries) if r.gold is not None else ()
                r.call_ids = list(tok.encode(protocol.format_read_call(r.queries))) if r.queries else []
        # Results: one batched memory query for the round.
        flat = [(r, q) for r in reads for q in r.queries] if setting.results != "gold_only" else []
        answers = query_untrusted(memory, [q for _, q in flat]) if (flat and memory is not None) else []
        per_read: dict[int, list] = {}
        for (r, _), a in zip(flat, answers):
            per_read.setdefault(id(r), []).append(a)
        for r in reads:
            entities = list(merge_results(per_read.get(id(r), []))[0])  # whatever is not too large
            targets = list(r.gold.targets) if r.gold is not None else []
            if setting.results == "gold_only" and targets:
                entities = targets
            elif setting.results == "memory+gold":
                entities = entities + [t for t in targets if t not in entities]
            r.state.n_reads += 1
            if targets and any(t in entities for t in targets):
                r.state.n_target_hit += 1
            if r.gold is not None and setting.queries == "model":
                for key, value in check_queries(r.queries, r.gold.queries).items():
                    r.state.query_checks[key] += value
            if r.state.events is not None:
                r.state.events.append(read_event(tok, r.pos, r.call_ids, r.queries, entities, r.gold))
            if entities and r.call_ids:
                r.state.n_nonempty += 1
                r.result_ids = list(tok.encode(protocol.format_read_result(entities)))
            else:
                r.call_ids, r.result_ids = [], []  # removed read: the text context alone
        # One forward per read (reads returning nothing reuse the plain forward).
        to_score = [r for r in reads if r.call_ids] + extensions
        # A read's context before it is the plain text (an earlier read is removed when a new one starts), so
        # its continuation attends to the plain forward's keys / values of BOS + text[:pos].
        conts = [r.call_ids + r.result_ids + r.state.enc.ids[r.pos:r.end + 1] for r in to_score]
        if scorer.keeps_kv:
            scores = scorer.score_continuations([(plain_by_id[id(r.state)], 1 + r.pos, c) for r, c in zip(to_score, conts)])
        else:
            scores = scorer.score([[tok.bos_id] + r.state.enc.ids[:r.pos] + c for r, c in zip(to_score, conts)])
        scored = dict(zip(map(id, to_score), scores))
        for r in sorted(reads + extensions, key=lambda r: r.pos):
            s = r.state
            if id(r) in scored:
                f, shift = scored[id(r)], len(r.call_ids) + len(r.result_ids)
            else:
                f, shift = plain_by_id[id(s)], 0
            # This read's context covers tokens pos+1 .. end (inclusive: at the next read position `end` it is
            # the no-read branch and gives p(MR)); the read position itself is the read branch.
            lo, hi = r.pos, min(r.end + 1, len(s.enc.ids))
            s.read[lo] = True
            s.logp_read[lo] = f.lp_next[lo + shift]
            s.logp_path[lo + 1:hi] = f.lp_next[lo + 1 + shift:hi + shift]
            s.logp_mr[lo + 1:hi] = f.lp_mr[lo + 1 + shift:hi + shift]
            # After an extension the search goes on where the shorter forward ended (it found no read before).
            s.cursor = s.covered if r.extends else lo + 1
            s.forward, s.forward_shift = f, shift
            s.covered, s.last_read = (hi, r) if id(r) in scored else (len(s.enc.ids), None)
        if progress:
            progress(f"  round {round_no}: {len(reads)} reads, {len(to_score) - len(extensions)} with results"
                     + (f", {len(extensions)} scored further" if extensions else ""))
        release_if_many_mappings(progress)  # each round may compile new shapes (runtime/compiled_code.py)

    per_doc, nlls, traces = [], [], []
    for s in states:
        logp = mix_logprobs(s.logp_path, s.logp_read, s.logp_mr, s.read)
        if s.events is not None:
            traces.append(doc_trace(s.enc, logp, logp_plain[len(traces)], s.events))
        d = span_nll(logp, s.enc.masks)
        nlls.append(d)
        per_doc.append({"doc": s.enc.doc.doc_id, "reads": s.n_reads, "nonempty": s.n_nonempty,
                        "target_hits": s.n_target_hit, "ppl": d.perplexities()})
    total = SpanNLL()
    for d in nlls:
        total.add(d)
    n_reads = sum(s.n_reads for s in states)
    stats = {"documents": len(states), "reads": n_reads,
             "reads_with_results": sum(s.n_nonempty for s in states),
             "target_in_results": sum(s.n_target_hit for s in states),
             "gold_reads": sum(len(s.enc.read_tokens) for s in states),
             **{key: sum(s.query_checks[key] for s in states) for key in QUERY_CHECKS},
             "tokens": total.count.get("overall", 0)}
    work = scorer.work
    if generator is not None:
        work += generator.work
    return PerplexityResult(corpus_perplexities(nlls), total, stats, per_doc, traces, work)


def _next_reads(s: _DocState, setting: ReadSetting, mr_id: int) -> list[_Read]:
    """The reads a document makes this round: all gold reads at once, or the next model-chosen one."""
    T = len(s.enc.ids)
    if setting.positions == "gold":
        if s.n_reads:
            return []
        golds = sorted({p: g for p, g in zip(s.enc.read_tokens, s.enc.doc.reads) if p < T}.items())
        out = []
        for k, (p, g) in enumerate(golds):
            end = golds[k + 1][0] if k + 1 < len(golds) else T
            out.append(_Read(s, p, g, end=end))
        return out
    if s.n_reads >= setting.max_reads or s.cursor >= T:
        return []
    f, shift = s.forward, s.forward_shift
    lo, hi = s.cursor, s.covered
    if setting.read_threshold is None:
        hits = np.nonzero(f.argmax[lo + shift:hi + shift] == mr_id)[0]
    else:
        hits = np.nonzero(f.lp_mr[lo + shift:hi + shift] >= np.log(setting.read_threshold))[0]
    if not len(hits):
        if hi >= T or s.last_read is None:
            return []
        last = s.last_read
        return [dataclasses.replace(last, end=min(T, last.pos + 2 * (hi - last.pos)) - 1, extends=True)]
    pos = lo + int(hits[0])
    gold = None
    for p, g in zip(s.enc.read_tokens, s.enc.doc.reads):
        if p == pos:
            gold = g
    end = T if setting.window <= 0 else min(T, pos + setting.window) - 1
    return [_Read(s, pos, gold, end=end)]
