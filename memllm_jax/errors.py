"""Bad input: the exception the `memllm` command prints as one line `error: <file>: <where>: <what>` (exit 2),
and the helpers loaders use so a decoding or JSON error names the file and the position in it."""

from __future__ import annotations

import codecs
import json
import os
from typing import Any


class InputError(ValueError):
    """A file, record, field or option the user gave is unusable. The message starts with the file (or the
    option) and names the record and field, e.g. `corpus.json: document 3: field vertexSet: missing`."""


def not_utf8(path: str | os.PathLike) -> InputError:
    """The error for a file that is not UTF-8, naming the byte offset of its first invalid byte."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            pending = len(decoder.getstate()[0])
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as exc:
                at = offset - pending + exc.start
                return InputError(f"{path}: byte offset {at}: not UTF-8 text ({exc.reason}, byte 0x{exc.object[exc.start]:02x})")
            offset += len(chunk)
    return InputError(f"{path}: byte offset {offset}: not UTF-8 text (truncated multi-byte character at the end)")


def json_error(path: str | os.PathLike, exc: json.JSONDecodeError) -> InputError:
    """`path: invalid JSON: <what>: line L column C (char N)`, saying so when the file looks truncated."""
    return InputError(f"{path}: invalid JSON: {exc}{truncation_note(exc.doc)}")


def truncation_note(tail: str, length: int | None = None) -> str:
    """'; the file ends ... (truncated?)' when a JSON text (its `tail`, `length` chars in all) does not end with a
    closing bracket or brace."""
    length = len(tail) if length is None else length
    end = tail.rstrip()[-1:]
    return "" if end in ("]", "}") else f"; the file ends at char {length} without a closing ']' or '}}' (truncated?)"


def read_text(path: str | os.PathLike) -> str:
    """A UTF-8 text file's contents; a decoding error names the file and byte offset."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def load_json(path: str | os.PathLike) -> Any:
    """A whole JSON file; errors name the file and the position."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise json_error(path, exc) from None
