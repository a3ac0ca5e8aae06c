"""Atomic output: every file the project writes appears whole or not at all.

A file is written to a uniquely named temporary file beside its target, flushed to disk, then renamed over the
target (`os.replace`, atomic on POSIX); on any exception the temporary file is removed and the target is left as
it was. So an interrupted run, a full disk or a crash never leaves a half-written result, checkpoint manifest,
stage stamp or memory table behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import tempfile
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[Any]:
    """`with atomic_open(path) as f: ...`: a temp file beside `path` ("w": UTF-8 text, "wb": bytes) that replaces
    `path` when the block ends without an exception, and is removed when it raises."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, **dumps_kwargs: Any) -> None:
    """`obj` as JSON (`json.dumps(obj, **dumps_kwargs)`) and a final newline."""
    atomic_write_text(path, json.dumps(obj, **dumps_kwargs) + "\n")
