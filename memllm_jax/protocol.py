"""The memory API as text: every marker string lives here and only here.

Formats (those of the original MemLLM implementation):

    write example:  pretext + "({USER_ST})" + sentence + "({USER_END})" + "({MEM_WRITE-->s>>r>>o;s>>r>>o})" + EOS
    empty write:    "({MEM_WRITE-->})"
    read call:      "({MEM_READ(" + "s>>r>>;>>r>>o" + ")-->" + "e1;e2" + "})"
    empty read:     "({MEM_READ(" + "s>>r>>" + ")-->" + "})"   (kept only by memory-aware reading, see `ABSTAIN`)

Tokenizers register every marker in `MARKERS` as a special token (one id each). Text that merely contains
a marker string (a document, a user message) goes through `escape_text` on the way in, so it can never
produce a marker id, and `unescape_text` on the way out. Names inside calls additionally escape the field
separators (`escape_name`), so names containing ">>", ";" or "})" round-trip.

Escaping: `ESC` (a private-use code point) makes the next character literal. `escape_text` doubles every
ESC and puts an ESC inside every marker-forming pair ("({", "})", ")-->"); `unescape_text` drops each
ESC and keeps the character after it.

The parsers accept untrusted model output: they never raise; malformed or truncated input yields what
could be recovered plus a list of reasons.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Sequence

USER_ST = "({USER_ST})"
USER_END = "({USER_END})"
MEM_WRITE = "({MEM_WRITE-->"
MEM_READ = "({MEM_READ("
READ_END = ")-->"
CALL_END = "})"
FIELD_SEP = ">>"
ITEM_SEP = ";"
CALL_OPEN = "({"
"""The two characters that open every API call; p(MR) in the perplexity mixture is p(MEM_READ token)."""
WRITE_BRIDGE = " It is or they are "
"""Joins an editing question and its new answer into a sentence for the memory-write model (paper §4.3)."""
ABSTAIN = "unknown"
"""What a memory-aware read model answers when its read finds nothing (not in the paper, whose Limitations say
MemLLM is not memory-aware: the empty call is removed and the model answers from its weights). The empty result
stays in the context as the call closed with nothing (`format_empty_read`), and the answer follows it."""

MARKERS: tuple[str, ...] = (USER_ST, USER_END, MEM_WRITE, MEM_READ, READ_END, CALL_END)
"""Strings registered as special tokens, one id each."""

ESC = "\ue000"


@dataclasses.dataclass(frozen=True, order=True)
class Triple:
    subject: str
    relation: str
    object: str


@dataclasses.dataclass(frozen=True, order=True)
class Query:
    """An object query <s, r, *> (object=None) or a subject query <*, r, o> (subject=None)."""

    subject: str | None
    relation: str
    object: str | None

    @property
    def is_object_query(self) -> bool:
        return self.object is None

    @property
    def given_entity(self) -> str:
        return self.subject if self.object is None else self.object  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class Parsed:
    """What a parser recovered from untrusted text, and why anything was dropped."""

    items: tuple = ()
    errors: tuple[str, ...] = ()
    complete: bool = True
    """False when the call was cut off before its closing marker."""

    @property
    def ok(self) -> bool:
        return not self.errors and self.complete


# ----------------------------------------------------------------------------------------------- escaping


def escape_text(text: str) -> str:
    """Make `text` free of marker strings; reversible with `unescape_text`."""
    if ESC not in text and "({" not in text and "})" not in text and ")-->" not in text:
        return text
    return escape_text_with_offsets(text)[0]


def escape_text_with_offsets(text: str) -> tuple[str, list[int]]:
    """`escape_text` plus `offsets`, where `offsets[i]` is the index in the escaped text at which original
    character `i` (with any ESC put before it) starts; `offsets[len(text)]` is the escaped length.
    Character spans of the plain text map to spans of the escaped text as `(offsets[s], offsets[e])`."""
    out: list[str] = []
    offsets: list[int] = []
    n = 0
    prev = ""
    for i, ch in enumerate(text):
        offsets.append(n)
        if ch == ESC:
            out.append(ESC)
            n += 1
        elif (prev == "(" and ch == "{") or (prev == "}" and ch == ")"):
            out.append(ESC)
            n += 1
        elif prev == ")" and ch == "-" and text.startswith("-->", i):
            out.append(ESC)
            n += 1
        out.append(ch)
        n += 1
        prev = ch
    offsets.append(n)
    return "".join(out), offsets


def unescape_text(text: str) -> str:
    """Inverse of `escape_text` and `escape_name`: drop each ESC, keep the character after it."""
    if ESC not in text:
        return text
    out: list[str] = []
    it = iter(text)
    for ch in it:
        if ch == ESC:
            out.append(next(it, ""))
        else:
            out.append(ch)
    return "".join(out)


def escape_name(name: str) -> str:
    """Escape an entity or relation name for use inside a call (also protects every ">" and ";")."""
    text = escape_text(name)
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == ESC:
            out.append(text[i : i + 2])
            i += 2
            continue
        if text[i] in ">;":
            out.append(ESC)
        out.append(text[i])
        i += 1
    return "".join(out)


def unescaped_spans(text: str, sep: str) -> list[tuple[int, int]]:
    """`(start, end)` character spans of the pieces of `text` between occurrences of `sep` not preceded by ESC."""
    spans: list[tuple[int, int]] = []
    start = i = 0
    while i < len(text):
        if text[i] == ESC:
            i += 2
            continue
        if text.startswith(sep, i):
            spans.append((start, i))
            i += len(sep)
            start = i
            continue
        i += 1
    spans.append((start, len(text)))
    return spans


def _split_unescaped(text: str, sep: str) -> list[str]:
    """Split on `sep` where it is not preceded by ESC (the pieces keep their escapes)."""
    return [text[a:b] for a, b in unescaped_spans(text, sep)]


def _find_unescaped(text: str, needle: str, start: int = 0) -> int:
    i = start
    while i < len(text):
        if text[i] == ESC:
            i += 2
            continue
        if text.startswith(needle, i):
            return i
        i += 1
    return -1


# --------------------------------------------------------------------------------------------- formatting


def format_triple(triple: Triple) -> str:
    return FIELD_SEP.join(escape_name(x) for x in (triple.subject, triple.relation, triple.object))


def format_query(query: Query) -> str:
    subject = escape_name(query.subject) if query.subject is not None else ""
    obj = escape_name(query.object) if query.object is not None else ""
    return f"{subject}{FIELD_SEP}{escape_name(query.relation)}{FIELD_SEP}{obj}"


def format_write_call(triples: Sequence[Triple]) -> str:
    """`({MEM_WRITE-->s>>r>>o;...})`; no triples gives `({MEM_WRITE-->})`."""
    return MEM_WRITE + ITEM_SEP.join(format_triple(t) for t in triples) + CALL_END


def format_write_prompt(pretext: str, sentence: str) -> str:
    """The memory-write model's input x_i^MW (texts are escaped here)."""
    return escape_text(pretext) + USER_ST + escape_text(sentence) + USER_END


def format_read_call(queries: Sequence[Query]) -> str:
    """`({MEM_READ(q1;q2)-->`, the part of a read the model generates."""
    return MEM_READ + ITEM_SEP.join(format_query(q) for q in queries) + READ_END


def format_read_result(entities: Iterable[str]) -> str:
    """`e1;e2})`, the part of a read the memory answers."""
    return ITEM_SEP.join(escape_name(e) for e in entities) + CALL_END


def format_empty_read(queries: Sequence[Query]) -> str:
    """`({MEM_READ(q1;q2)-->})`: a read whose result is empty, kept in the context (`ABSTAIN`)."""
    return format_read_call(queries) + format_read_result(())


# ------------------------------------------------------------------------------------------------ parsing


def _parse_fields(item: str, where: str) -> tuple[list[str] | None, str | None]:
    fields = _split_unescaped(item, FIELD_SEP)
    if len(fields) != 3:
        return None, f"{where}: expected 3 fields separated by '{FIELD_SEP}', got {len(fields)}: {item!r}"
    return [unescape_text(f).strip() for f in fields], None


def parse_triples(body: str) -> Parsed:
    """Parse the body of a write call (`s>>r>>o;s>>r>>o`, without the markers)."""
    try:
        if not body.strip():
            return Parsed()
        triples: list[Triple] = []
        errors: list[str] = []
        for k, item in enumerate(_split_unescaped(body, ITEM_SEP)):
            fields, err = _parse_fields(item, f"triple {k}")
            if err:
                errors.append(err)
            elif not all(fields):  # type: ignore[arg-type]
                errors.append(f"triple {k}: empty subject, relation or object: {item!r}")
            else:
                triples.append(Triple(*fields))  # type: ignore[misc]
        return Parsed(tuple(triples), tuple(errors))
    except Exception as exc:  # noqa: BLE001 - the parser must never raise on model output
        return Parsed((), (f"internal parser error: {exc!r}",))


def parse_queries(body: str) -> Parsed:
    """Parse the body of a read call (`s>>r>>;>>r>>o`, without the markers)."""
    try:
        if not body.strip():
            return Parsed((), ("empty query list",))
        queries: list[Query] = []
        errors: list[str] = []
        for k, item in enumerate(_split_unescaped(body, ITEM_SEP)):
            fields, err = _parse_fields(item, f"query {k}")
            if err:
                errors.append(err)
                continue
            subject, relation, obj = fields  # type: ignore[misc]
            if not relation:
                errors.append(f"query {k}: empty relation: {item!r}")
            elif bool(subject) == bool(obj):
                errors.append(f"query {k}: exactly one of subject and object must be given: {item!r}")
            else:
                queries.append(Query(subject or None, relation, obj or None))
        return Parsed(tuple(queries), tuple(errors))
    except Exception as exc:  # noqa: BLE001
        return Parsed((), (f"internal parser error: {exc!r}",))


def parse_entities(body: str) -> list[str]:
    """Parse a read result body (`e1;e2`) into names."""
    if not body.strip():
        return []
    return [unescape_text(e).strip() for e in _split_unescaped(body, ITEM_SEP) if e.strip()]


TRUNCATION_NOTES = ("unfinished last item dropped", "call not closed (truncated)")
"""How `parse_write_call` reports a call cut by a token budget (its closed items are kept)."""


def parse_write_call(text: str) -> Parsed:
    """Parse the first write call in `text` (model output). Never raises."""
    try:
        start = _find_unescaped(text, MEM_WRITE)
        if start < 0:
            return Parsed((), ("no memory-write call found",), complete=False)
        body_start = start + len(MEM_WRITE)
        end = _find_unescaped(text, CALL_END, body_start)
        if end < 0:  # cut by a token budget: keep the items closed by `;`, drop the unfinished last one
            *closed, unfinished = _split_unescaped(text[body_start:], ITEM_SEP)
            partial = parse_triples(ITEM_SEP.join(closed))
            dropped = (f"{TRUNCATION_NOTES[0]}: {unfinished!r}",) if unfinished.strip() else ()
            return Parsed(partial.items, partial.errors + dropped + (TRUNCATION_NOTES[1],), complete=False)
        return parse_triples(text[body_start:end])
    except Exception as exc:  # noqa: BLE001
        return Parsed((), (f"internal parser error: {exc!r}",), complete=False)


def _last_read_start(text: str) -> int:
    """Where the last read call of `text` starts (a `({MEM_READ(` not escaped), or -1."""
    start = text.rfind(MEM_READ)
    while start > 0 and text[start - 1] == ESC:
        start = text.rfind(MEM_READ, 0, start - 1)
    return start


def parse_read_call(text: str) -> Parsed:
    """Parse the queries of the last read call in `text` that has reached `)-->`. Never raises."""
    try:
        start = _last_read_start(text)
        if start < 0:
            return Parsed((), ("no memory-read call found",), complete=False)
        body_start = start + len(MEM_READ)
        end = _find_unescaped(text, READ_END, body_start)
        if end < 0:
            return Parsed((), ("read call not closed with ')-->' (truncated)",), complete=False)
        return parse_queries(text[body_start:end])
    except Exception as exc:  # noqa: BLE001
        return Parsed((), (f"internal parser error: {exc!r}",), complete=False)


def parse_read_result(text: str) -> tuple[str, ...] | None:
    """The entities answering the last read call in `text`: () when it was closed with nothing (an empty read
    kept in the context, `format_empty_read`), None when that call has no answer yet or `text` has none. Never
    raises."""
    try:
        start = _last_read_start(text)
        answer = _find_unescaped(text, READ_END, start + len(MEM_READ)) if start >= 0 else -1
        end = _find_unescaped(text, CALL_END, answer + len(READ_END)) if answer >= 0 else -1
        return tuple(parse_entities(text[answer + len(READ_END) : end])) if end >= 0 else None
    except Exception:  # noqa: BLE001
        return None


def strip_calls(text: str) -> str:
    """Remove every API call (complete or truncated) and unescape: the plain text a reader sees."""
    out: list[str] = []
    i = 0
    while i < len(text):
        j = _find_unescaped(text, CALL_OPEN, i)
        if j < 0:
            out.append(text[i:])
            break
        out.append(text[i:j])
        end = _find_unescaped(text, CALL_END, j + len(CALL_OPEN))
        if text.startswith(USER_ST, j) or text.startswith(USER_END, j):
            i = j + len(USER_ST if text.startswith(USER_ST, j) else USER_END)
            continue
        i = len(text) if end < 0 else end + len(CALL_END)
    return unescape_text("".join(out))
