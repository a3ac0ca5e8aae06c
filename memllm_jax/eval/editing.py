"""Table 3: knowledge editing by memory writes (paper §4.3), on ZsRE-format records.

Edits. Each edit is written by the memory-write model from the sentence `src + protocol.WRITE_BRIDGE + alt`
(the question, " It is or they are ", the new answer) bracketed as a focus sentence with no pretext; the
parsed triples are added with replace semantics (a triple with the same subject and relation replaces the
stored ones), to a memory whose retrieval uses the editing thresholds (`config.EDITING_MEMORY`).

Questions. A 5-shot QA prompt (`Q: question\nA: answer\n\n`); the fifth shot contains a complete memory
read after its question; the test question follows and a read is forced right after it. The answer is
the generated text (API calls removed) after the read, up to the first line break, with a leading "A:"
dropped.

Cloze style (`style="cloze"`, the embedded default's synthetic analogue): a tiny model trained only on the
corpus's documents cannot follow a QA prompt, so each question is the start of a corpus-style sentence
("Vos Grestougul worked for "), the edit is the whole sentence with the new object (`EditRecord.statement`),
the read is forced right after the sentence start, and the answer is the continuation up to the end of
its clause.

Scoring rule (one number per question, averaged over records):
- REL: the answer to `src` equals `alt`;
- GEN: the answer to `rephrase` equals `alt`;
- LOC: the answer to `loc` equals the answer the same model gives to `loc` with an empty memory (no edits).
"Equals" compares normalised strings: lowercased, punctuation and the articles a/an/the removed,
whitespace collapsed (SQuAD's normalisation). AVG is the mean of REL, GEN and LOC.

Two regimes: sequential (all T edits written in order into one memory, then every question asked) and
single (T = 1: a fresh memory holding only that record's edit for each record).

Absent facts (`absent`, off by default; `eval.abstention`): questions about held-out facts the memory does not
hold, asked of the sequential memory; the share answered `protocol.ABSTAIN` and the share that name something,
next to REL / GEN. `keep_empty` keeps every question's empty read in its context (memory-aware reading).

Errors by kind (`error_kinds`, after the paper's qualitative analysis in §4.3): each wrong REL / GEN answer is
counted once, at the first stage that lost the edit's answer: the memory-write model wrote no triple with it as
the object ("write"), a later edit's triple replaced it ("replaced"), the forced read did not return it ("read"),
or the read returned it and the answer is another ("use").
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import string
from typing import TYPE_CHECKING, Any, Callable, Collection, Sequence

from memllm_jax import protocol
from memllm_jax.config import EDITING_MEMORY
from memllm_jax.errors import InputError, load_json

if TYPE_CHECKING:
    from memllm_jax.decode.writer import WriteDecoding
    from memllm_jax.eval.abstention import AbsentQuestion, AbstentionResult
    from memllm_jax.eval.scoring import ModelWork


@dataclasses.dataclass(frozen=True)
class EditRecord:
    src: str
    rephrase: str
    alt: str
    loc: str
    loc_ans: str = ""
    statement: str = ""
    """The sentence the memory-write model reads; "" = `src + " It is or they are " + alt` (the paper's form)."""
    subject: str = ""
    """The entity the edit is about (ZsRE's `subject` field; "" when the file has none)."""


@dataclasses.dataclass(frozen=True)
class Shot:
    question: str
    answer: str
    queries: tuple[protocol.Query, ...] = ()
    """Non-empty only for the last shot: the read call placed after its question (answered by `answer`)."""


ZSRE_SHOTS: tuple[Shot, ...] = (
    Shot("What is the capital of France?", "Paris"),
    Shot("Which country is Mount Fuji located in?", "Japan"),
    Shot("Who wrote the novel Pride and Prejudice?", "Jane Austen"),
    Shot("What language is spoken in Brazil?", "Portuguese"),
    Shot("Where was Barack Obama born?", "Honolulu", (protocol.Query("Barack Obama", "place of birth", None),)),
)
"""The 5-shot prompt for ZsRE questions: four plain pairs, the fifth with a full memory read."""


def load_zsre(path: str | pathlib.Path, limit: int | None = None,
              skipped: list[int] | None = None) -> list[EditRecord]:
    """The first `limit` usable records. A record whose edit target `alt` is an empty string has nothing to
    edit (the shared 200-record file has two): it is skipped and its index appended to `skipped`. A missing
    or non-string field is an error naming the file, record and field."""
    path = pathlib.Path(path)
    data = load_json(path)
    if not isinstance(data, list):
        raise InputError(f"{path}: expected a JSON list of ZsRE records, got {type(data).__name__}")
    out: list[EditRecord] = []
    for k, rec in enumerate(data):
        if limit and len(out) >= limit:
            break
        if not isinstance(rec, dict):
            raise InputError(f"{path}: record {k}: expected a JSON object")
        for field in ("src", "rephrase", "alt", "loc"):
            if not isinstance(rec.get(field), str) or (field != "alt" and not rec[field].strip()):
                raise InputError(f"{path}: record {k}: field {field!r} missing or not a non-empty string")
        if not rec["alt"].strip():
            if skipped is not None:
                skipped.append(k)
            continue
        loc = rec["loc"]
        loc = loc[len("nq question: "):] if loc.startswith("nq question: ") else loc
        loc = loc if loc.rstrip().endswith("?") else loc.rstrip() + "?"
        out.append(EditRecord(rec["src"], rec["rephrase"], rec["alt"], loc, str(rec.get("loc_ans", "")),
                              subject=str(rec.get("subject") or "")))
    return out


def normalize_answer(text: str) -> str:
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def extract_answer(plain_text: str) -> str:
    """The first non-empty line of the generated plain text, without a leading "A:"."""
    for line in plain_text.split("\n"):
        line = line.strip()
        if line.startswith("A:"):
            line = line[2:].strip()
        if line:
            return line
    return ""


def extract_cloze_answer(plain_text: str) -> str:
    """The generated continuation of a cloze prompt up to the end of its clause (`.`, `,`, `;` or a line break)."""
    return re.split(_CLAUSE_END, plain_text, maxsplit=1)[0].strip()


_CLAUSE_END = r"[.,;\n]"


def clause_end_ids(tok: Any) -> list[int]:
    """The ids of the tokens whose text holds a clause end: outside calls, the first one sampled completes a
    cloze answer."""
    return [i for i in range(tok.vocab_size) if re.search(_CLAUSE_END, tok.decode([i]))]


def answer_complete(plain_text: str, style: str) -> bool:
    """Whether more text can no longer change the answer `extract_answer` (QA: a complete non-empty line) or
    `extract_cloze_answer` (a clause end) takes from `plain_text`."""
    if style == "cloze":
        return re.search(_CLAUSE_END, plain_text) is not None
    return any(extract_answer(line) for line in plain_text.split("\n")[:-1])


def build_cloze_prompt_ids(tok: Any, prompt: str) -> list[int]:
    """BOS + the sentence start + an opened read call (the forced read), as in the read model's training text.
    The sentence start's trailing space is dropped: in the training text a call sits right after the word before
    the answer ("a citizen of" + call + " Murestan"); with a tokenizer whose spaces belong to the next word, a
    prompt "a citizen of " would end in a lone space token the model never saw before a call."""
    return [tok.bos_id] + tok.encode(protocol.escape_text(prompt.rstrip())) + [tok.marker_id[protocol.MEM_READ]]


def build_prompt_ids(tok: Any, shots: Sequence[Shot], question: str) -> list[int]:
    """BOS + the shots + `Q: question` + an opened read call (the forced read)."""
    ids = [tok.bos_id]
    for shot in shots:
        ids += tok.encode(protocol.escape_text(f"Q: {shot.question}"))
        if shot.queries:
            ids += tok.encode(protocol.format_read_call(shot.queries) + protocol.format_read_result([shot.answer]))
        ids += tok.encode(protocol.escape_text(f"\nA: {shot.answer}\n\n"))
    ids += tok.encode(protocol.escape_text(f"Q: {question}"))
    ids.append(tok.marker_id[protocol.MEM_READ])
    return ids


EDIT_WRITE_TOKENS = 64
"""The token budget of an edit's memory-write call: an edit is one sentence stating one fact."""


def edit_sentence(rec: EditRecord) -> str:
    return rec.statement or rec.src + protocol.WRITE_BRIDGE + rec.alt


EDIT_BATCH = 32
"""Rows per batch of the edits' writes and answers (`evaluate_editing`)."""


def extract_edits(write_model: Any, tok: Any, records: Sequence[EditRecord],
                  decoding: WriteDecoding | None = None, *,
                  batch_size: int = 16, grounded: bool = False, relations: Collection[str] | None = None,
                  min_confidence: float | None = None, work: ModelWork | None = None) -> list[list[protocol.Triple]]:
    """Triples the memory-write model extracts from each edit sentence, decoded as `decoding` says
    (`decode.writer.WriteDecoding`; None: `EDIT_WRITE_TOKENS` with late stopping, paper Appendix A). `grounded` /
    `relations` / `min_confidence`: the memory stage's checks (`corpus_writer.check_written`), with the edit
    sentence as both the document and the focus sentence. `work`, if given, counts what ran through the model."""
    from memllm_jax.decode.corpus_writer import check_written
    from memllm_jax.decode.writer import WriteDecoding, decode_writes  # noqa: F811 - at run time

    decoding = WriteDecoding(max_new_tokens=EDIT_WRITE_TOKENS) if decoding is None else decoding
    sentences = [edit_sentence(r) for r in records]
    prompts = [[tok.bos_id] + tok.encode(protocol.format_write_prompt("", s) + protocol.MEM_WRITE) for s in sentences]
    out: list[list[protocol.Triple]] = []
    for i in range(0, len(prompts), batch_size):
        res = decode_writes(write_model, tok, prompts[i:i + batch_size], decoding, pad_to=batch_size)
        for sentence, prompt, r in zip(sentences[i:i + batch_size], prompts[i:i + batch_size], res):
            if work is not None:
                work.generation(len(prompt), r["n_generated"], r["n_generated"])
            items = list(protocol.parse_write_call(r["text"]).items)  # unclosed: items closed by `;`
            out.append(check_written(items, r, tok, (sentence, sentence) if grounded else None, relations,
                                     min_confidence).kept)
    return out


@dataclasses.dataclass(frozen=True)
class Answer:
    text: str
    """The extracted answer (`extract_answer` / `extract_cloze_answer`)."""
    read_results: tuple[str, ...] = ()
    """The entities the forced read returned (empty when it found nothing or was malformed)."""


def answer_questions(read_model: Any, tok: Any, memory: Any, questions: Sequence[str], shots: Sequence[Shot], *,
                     max_new_tokens: int = 48, batch_size: int = 16, style: str = "qa",
                     keep_empty: bool = False) -> list[str]:
    """Answers with a forced read: `style="qa"` asks `questions` in the 5-shot prompt; `"cloze"` continues
    each question as a sentence start (no shots). `memory`: one memory, or one per question. `keep_empty`: a read
    that finds nothing stays in the context (`generate_with_memory`)."""
    return [a.text for a in ask_questions(read_model, tok, memory, questions, shots, max_new_tokens=max_new_tokens,
                                          batch_size=batch_size, style=style, keep_empty=keep_empty)]


def ask_questions(read_model: Any, tok: Any, memory: Any, questions: Sequence[str], shots: Sequence[Shot], *,
                  max_new_tokens: int = 48, batch_size: int = 16, style: str = "qa",
                  keep_empty: bool = False, work: ModelWork | None = None) -> list[Answer]:
    """`answer_questions` with what each forced read returned; `work`, if given, counts what ran through the
    model (a rewind's re-fed tokens not counted)."""
    from memllm_jax.decode.reader import generate_with_memory

    if style not in ("qa", "cloze"):
        raise ValueError(f"editing prompt style must be 'qa' or 'cloze', got {style!r}")
    if not questions:
        return []
    if style == "qa":
        prompts, extract = [build_prompt_ids(tok, shots, q) for q in questions], extract_answer
    else:
        prompts, extract = [build_cloze_prompt_ids(tok, q) for q in questions], extract_cloze_answer
    # A row stops once its answer is complete (the same answer as generating to the budget, in fewer steps): a
    # cloze answer at the first clause end it writes; a QA answer once a loop exit finds its line complete.
    if style == "cloze":
        stops, done = clause_end_ids(tok), None
    else:
        stops = ()
        done = [lambda ids, q=q, n=len(p): answer_complete(_text_after(tok, ids, n, q), style)
                for p, q in zip(prompts, questions)]
    res = generate_with_memory(read_model, tok, memory, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                               chunk=16, stop_ids=stops, done_when=done, keep_empty=keep_empty)
    for r in res if work is not None else ():
        work.generation(len(r.prompt_ids), len(r.token_ids), r.n_generated)
    return [Answer(extract(_text_after(tok, list(r.prompt_ids) + list(r.token_ids), len(r.prompt_ids), q)),
                   tuple(r.calls[0].result) if r.calls else ())  # the forced read is the row's first call
            for r, q in zip(res, questions)]


def _text_after(tok: Any, ids: Sequence[int], prompt_len: int, question: str) -> str:
    """The plain text after the question in a row's context `ids` (prompt + generated). The forced read opens
    inside the prompt (and a removed one rewinds into it), so calls are stripped from the whole context, not
    from the generated tokens alone."""
    plain = protocol.strip_calls(tok.decode(list(ids)))
    question = question.rstrip()  # a cloze prompt's trailing space is not in it (`build_cloze_prompt_ids`)
    at = plain.rfind(question)
    return plain[at + len(question):] if at >= 0 else protocol.strip_calls(tok.decode(list(ids[prompt_len:])))


@dataclasses.dataclass
class EditingResult:
    regime: str
    n_edits: int
    rel: float
    gen: float
    loc: float
    written_triples: int
    edits_with_triples: int
    examples: list[dict]
    edits_in_memory: int = 0
    """Records whose edit is still in the memory when the questions are asked: a triple with the new object that
    their edit wrote, not replaced by a later edit's triple with the same subject and relation."""
    overwritten_later: int = 0
    """Records whose subject a later record edits to a different answer (`overwritten_later`): in the sequential
    regime a writer with one relation per subject leaves them answered by the later edit."""
    rel_in_memory: float = 0.0
    """REL over those records only: how well the read model uses edits the memory holds (the rest failed at the
    write, or a later edit overwrote theirs)."""
    gen_in_memory: float = 0.0
    """GEN over the same records."""
    errors_rel: dict[str, int] = dataclasses.field(default_factory=dict)
    """The wrong REL answers by the stage that lost the edit (`error_kinds`; empty when not measured)."""
    errors_gen: dict[str, int] = dataclasses.field(default_factory=dict)
    """The same for GEN."""

    @property
    def avg(self) -> float:
        return (self.rel + self.gen + self.loc) / 3

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["avg"] = self.avg
        return d


def edits_in_memory(records: Sequence[EditRecord], memory_records: Sequence[dict]) -> list[bool]:
    """Per edit record k: does the memory (its `records()`, edits stored with source `edit{k}`) still hold a
    triple of that edit whose object is the record's new object?"""
    held = {(m["source"], normalize_answer(m["object"])) for m in memory_records}
    return [(f"edit{k}", normalize_answer(r.alt)) in held for k, r in enumerate(records)]


def overwritten_later(records: Sequence[EditRecord]) -> list[bool]:
    """Per record: does a later record about the same subject (`EditRecord.subject`) set a different answer?
    ZsRE asks the same fact several times with different new answers (the shared 198 records name 104 subjects).
    Written as triples of one relation per subject, the later edit replaces the earlier one (replace semantics),
    so a sequential run cannot answer these records with their own edit: 1 - their share bounds sequential REL
    for such a writer. Records without a subject are never counted."""
    last = {r.subject: normalize_answer(r.alt) for r in records if r.subject}
    return [bool(r.subject) and last[r.subject] != normalize_answer(r.alt) for r in records]


ERROR_KINDS = {"write": "no triple with the answer written", "replaced": "replaced by a later edit",
               "read": "not returned by the read", "use": "returned, another answer given"}
"""Where a wrong answer lost the edit (module docstring), in words: in this order, the first that applies."""


def error_kinds(records: Sequence[EditRecord], answers: Sequence[str], reads: Sequence[Sequence[str]],
                edits: Sequence[Sequence[protocol.Triple]], in_memory: Sequence[bool]) -> dict[str, int]:
    """The wrong `answers` counted by `ERROR_KINDS`: per record, its edit's triples (`edits`), whether the memory
    still holds one of them with the new object (`in_memory`) and what the forced read returned (`reads`)."""
    counts = dict.fromkeys(ERROR_KINDS, 0)
    for rec, answer, read, triples, held in zip(records, answers, reads, edits, in_memory):
        alt = normalize_answer(rec.alt)
        if normalize_answer(answer) == alt:
            continue
        if not any(normalize_answer(t.object) == alt for t in triples):
            counts["write"] += 1
        elif alt not in {normalize_answer(x) for x in read}:
            counts["read" if held else "replaced"] += 1
        else:
            counts["use"] += 1
    return counts


def _score(records, ans_src, ans_reph, ans_loc, ans_loc_base, edits, regime, in_memory,
           read_src=None, read_reph=None) -> EditingResult:
    """REL / GEN / LOC of the answers (strings); `read_src` / `read_reph`: what the forced reads returned, for the
    errors by kind."""
    eq = lambda a, b: normalize_answer(a) == normalize_answer(b)  # noqa: E731
    rel = [eq(a, r.alt) for a, r in zip(ans_src, records)]
    gen = [eq(a, r.alt) for a, r in zip(ans_reph, records)]
    loc = [eq(a, b) for a, b in zip(ans_loc, ans_loc_base)]
    n = max(1, len(records))
    n_held = sum(in_memory)
    on_held = lambda hits: sum(x for x, h in zip(hits, in_memory) if h) / max(1, n_held)  # noqa: E731
    examples = [{"src": r.src, "alt": r.alt, "triples": [list(dataclasses.astuple(t)) for t in e], "answer_src": a,
                 "answer_rephrase": g, "answer_loc": l, "answer_loc_unedited": b}
                for r, e, a, g, l, b in list(zip(records, edits, ans_src, ans_reph, ans_loc, ans_loc_base))[:20]]
    errors = [error_kinds(records, answers, reads, edits, in_memory) if reads is not None else {}
              for answers, reads in ((ans_src, read_src), (ans_reph, read_reph))]
    return EditingResult(regime, len(records), sum(rel) / n, sum(gen) / n, sum(loc) / n,
                         sum(len(e) for e in edits), sum(bool(e) for e in edits), examples, n_held,
                         sum(overwritten_later(records)) if regime == "sequential" else 0, on_held(rel), on_held(gen),
                         *errors)


def evaluate_editing(write_model: Any, read_model: Any, tok: Any, encoder: Any, records: Sequence[EditRecord], *,
                     shots: Sequence[Shot] = ZSRE_SHOTS, regimes: Sequence[str] = ("sequential", "single"),
                     memory_config=EDITING_MEMORY, batch_size: int = EDIT_BATCH, max_new_tokens: int = 48,
                     style: str = "qa", write_decoding: WriteDecoding | None = None, grounded: bool = False,
                     relations: Collection[str] | None = None, min_confidence: float | None = None,
                     absent: Sequence[AbsentQuestion] = (), keep_empty: bool = False,
                     progress: Callable[[str], None] | None = None, work: ModelWork | None = None) -> dict[str, EditingResult | AbstentionResult]:
    """REL / GEN / LOC after all edits written in sequence ("sequential") and with one edit at a time ("single").
    `write_decoding` / `grounded` / `relations` / `min_confidence`: write the edits as the memory stage writes
    (`extract_edits`); `max_new_tokens`: the answers' budget. `absent`: questions about facts the memory does not
    hold, asked after the sequential edits (`abstention.ABSENT_KEY` block); `keep_empty`: every question's empty
    read stays in its context. `work`, if given, counts what the writes and the answers ran through the models."""
    from memllm_jax.eval.abstention import ABSENT_KEY, score_abstention
    from memllm_jax.memory import TripleMemory

    say = progress or (lambda _m: None)
    say(f"  editing: writing {len(records)} edits with the memory-write model")
    edits = extract_edits(write_model, tok, records, write_decoding, batch_size=batch_size, grounded=grounded,
                          relations=relations, min_confidence=min_confidence, work=work)
    ask = lambda mem, qs: ask_questions(read_model, tok, mem, qs, shots, max_new_tokens=max_new_tokens,  # noqa: E731
                                        batch_size=batch_size, style=style, keep_empty=keep_empty, work=work)
    texts = lambda answers: [a.text for a in answers]  # noqa: E731
    reads = lambda answers: [a.read_results for a in answers]  # noqa: E731
    empty = TripleMemory(encoder, memory_config)
    say("  editing: locality answers without edits")
    loc_base = texts(ask(empty, [r.loc for r in records]))
    out: dict[str, EditingResult | AbstentionResult] = {}
    if "sequential" in regimes or absent:
        mem = TripleMemory(encoder, memory_config)
        for k, triples in enumerate(edits):
            if triples:
                mem.add(triples, source=f"edit{k}", replace=True)
        say(f"  editing: T={len(records)} sequential edits written ({len(mem.triples)} triples); asking")
    if "sequential" in regimes:
        a_src, a_reph = ask(mem, [r.src for r in records]), ask(mem, [r.rephrase for r in records])
        out["sequential"] = _score(records, texts(a_src), texts(a_reph), texts(ask(mem, [r.loc for r in records])),
                                   loc_base, edits, "sequential", edits_in_memory(records, mem.records()),
                                   reads(a_src), reads(a_reph))
    if absent:
        say(f"  editing: {len(absent)} questions about facts the memory does not hold")
        seq = out.get("sequential")
        out[ABSENT_KEY] = score_abstention(absent, ask(mem, [q.question for q in absent]), keep_empty=keep_empty,
                                           rel_present=seq.rel if seq else None, gen_present=seq.gen if seq else None)
    if "single" in regimes:  # one memory per record; its three questions share it, and batches mix records
        memories = []
        for k, triples in enumerate(edits):
            mem = TripleMemory(encoder, memory_config)
            if triples:
                mem.add(triples, source=f"edit{k}", replace=True)
            memories += [mem] * 3
        held = edits_in_memory(records, [m for mem in memories[::3] for m in mem.records()])
        answers = ask(memories, [q for rec in records for q in (rec.src, rec.rephrase, rec.loc)])
        a_src, a_reph, a_loc = answers[0::3], answers[1::3], answers[2::3]
        say("  editing: T=1 done")
        out["single"] = _score(records, texts(a_src), texts(a_reph), texts(a_loc), loc_base, edits, "single", held,
                               reads(a_src), reads(a_reph))
    return out
