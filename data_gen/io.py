"""Streaming JSON(L) input and atomic output.

Outputs are written atomically (`memllm_jax.files.atomic_open`): to a temporary file, moved into place only
when the writer closes without an exception, so a failed build never leaves a partial file.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any, Iterable, Iterator

from memllm_jax.errors import InputError, not_utf8, truncation_note
from memllm_jax.files import atomic_open


class JsonlWriter:
    """`with JsonlWriter(path) as w: w.write(record)`; atomic, one JSON object per line."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.count = 0
        self._cm = None
        self._f = None

    def __enter__(self) -> "JsonlWriter":
        self._cm = atomic_open(self.path)
        self._f = self._cm.__enter__()
        return self

    def write(self, record: dict) -> None:
        self._f.write(json.dumps(record, ensure_ascii=False) + "\n")
        self.count += 1

    def __exit__(self, *exc) -> bool:
        return bool(self._cm.__exit__(*exc))


def write_jsonl(path: str | os.PathLike, records: Iterable[dict]) -> int:
    with JsonlWriter(path) as w:
        for r in records:
            w.write(r)
    return w.count


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    """The records of a JSONL file; errors name the file and line (and byte offset for non-UTF-8)."""
    try:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise InputError(f"{path}: line {lineno}: invalid JSON: {exc.msg}: column {exc.colno}") from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def iter_json_array(path: str | os.PathLike, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Stream the elements of a top-level JSON array (or the lines of a .jsonl file) without loading it whole.
    Errors name the file, the element index and its character position."""
    path = pathlib.Path(path)
    if path.suffix == ".jsonl":
        yield from read_jsonl(path)
        return
    try:
        yield from _iter_json_array(path, chunk_chars)
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def _iter_json_array(path: pathlib.Path, chunk_chars: int) -> Iterator[Any]:
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8") as f:
        buf = f.read(chunk_chars)
        pos = len(buf) - len(buf.lstrip())
        if not buf[pos:pos + 1] == "[":
            found = "an empty file" if not buf.strip() else f"{buf[pos:pos + 1]!r} at char {pos}"
            raise InputError(f"{path}: expected a JSON array of documents (or a .jsonl file), found {found}")
        pos += 1
        dropped = 0  # characters of the file before buf[0]
        index = 0
        eof = False
        while True:
            while pos < len(buf) and buf[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(buf) and not eof:
                more = f.read(chunk_chars)
                eof = not more
                dropped, buf, pos = dropped + pos, buf[pos:] + more, 0
                continue
            if pos < len(buf) and buf[pos] == "]":
                return
            if pos >= len(buf):
                raise InputError(f"{path}: element {index} (char {dropped + pos}): the file ends without the array's "
                                 "closing ']' (truncated?)")
            try:
                obj, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if eof:
                    raise InputError(f"{path}: element {index} (char {dropped + pos}): invalid JSON: {exc.msg}: "
                                     f"char {dropped + exc.pos}{truncation_note(buf, dropped + len(buf))}") from None
                more = f.read(chunk_chars)
                eof = not more
                dropped, buf, pos = dropped + pos, buf[pos:] + more, 0
                continue
            if end == len(buf) and not eof:  # a number may continue in the next chunk
                more = f.read(chunk_chars)
                eof = not more
                dropped, buf, pos = dropped + pos, buf[pos:] + more, 0
                continue
            yield obj
            index += 1
            pos = end
            if pos > chunk_chars:
                dropped, buf, pos = dropped + pos, buf[pos:], 0


class JsonArrayWriter:
    """Atomically write a JSON array one element at a time (DocRED's file format, streamed)."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.count = 0

    def __enter__(self) -> "JsonArrayWriter":
        self._cm = atomic_open(self.path)
        self._f = self._cm.__enter__()
        self._f.write("[")
        return self

    def write(self, obj: Any) -> None:
        self._f.write(("\n" if self.count == 0 else ",\n") + json.dumps(obj, ensure_ascii=False))
        self.count += 1

    def __exit__(self, *exc) -> bool:
        if exc[0] is None:
            self._f.write("\n]\n")
        return bool(self._cm.__exit__(*exc))
