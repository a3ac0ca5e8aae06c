"""Atomic output: every file the project writes appears whole or not at all.

A file is written to a uniquely named temporary file beside its target, flushed to disk, then renamed over the
target (`os.replace`, atomic on POSIX); on any exception the temporary file is removed and the target is left as
it was. So an interrupted run, a full disk or a crash never leaves a half-written result, checkpoint manifest,
stage stamp or memory table behind.
"""

from __future__ import annotations

import contextlib
import errno
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
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file to write", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)  # its errors name the folder
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise naming(exc, path) from exc
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename in (None, tmp):  # a full disk, a failed rename: the target
            raise naming(exc, path) from exc
        raise


def naming(exc: OSError, target: str | os.PathLike) -> OSError:
    """`exc` (raised while writing a temp file or directory for `target`) as the same error naming `target`, so a
    message speaks of the file the user asked for, not of a temp name they never gave."""
    if exc.errno is None:
        return OSError(f"{target}: {exc}")
    return type(exc)(exc.errno, exc.strerror, str(target))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def atomic_write_json(path: str | os.PathLike, obj: Any, **dumps_kwargs: Any) -> None:
    """`obj` as JSON (`json.dumps(obj, **dumps_kwargs)`) and a final newline."""
    atomic_write_text(path, json.dumps(obj, **dumps_kwargs) + "\n")


def check_writable(path: str | os.PathLike, directory: bool = False) -> None:
    """Refuse, before any long work, an output that could not be written: a directory where a file goes (or a
    file where a directory goes), or a folder that cannot be created or written. An OSError naming the path."""
    path = pathlib.Path(path)
    if not directory and path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory, not a file to write", str(path))
    if directory and path.exists() and not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    parent = path if directory and path.is_dir() else path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory (cannot hold the output)", str(parent))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, "no permission to write here", str(parent))
