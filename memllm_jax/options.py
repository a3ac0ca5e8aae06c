"""Value types for numeric command-line options: a bad value is refused while the arguments are parsed, before
any model loads.

Each is an argparse `type=` that raises `argparse.ArgumentTypeError("<value>: <what it must be>")`; the
`memllm` parser turns that into one line naming the option (`--batch-size 0: must be a positive integer`) and
exit status 2. Imports nothing heavy: `memllm --help` stays fast.
"""

from __future__ import annotations

import argparse
import math


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: must be an integer") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text}: must be a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text}: must be a finite number")
    return value


def _require(value, ok: bool, text: str, what: str):
    """`value` when `ok`, else the one-line error `TEXT: must be WHAT`."""
    if not ok:
        raise argparse.ArgumentTypeError(f"{text}: must be {what}")
    return value


def positive_int(text: str) -> int:
    """A count: 1, 2, ..."""
    value = _int(text)
    return _require(value, value >= 1, text, "a positive integer")


def nonnegative_int(text: str) -> int:
    """A count that may be 0 (usually: off)."""
    value = _int(text)
    return _require(value, value >= 0, text, "a non-negative integer")


def finite_float(text: str) -> float:
    return _float(text)


def nonnegative_float(text: str) -> float:
    value = _float(text)
    return _require(value, value >= 0, text, "a non-negative number")


def probability(text: str) -> float:
    """A probability or rate in [0, 1]."""
    value = _float(text)
    return _require(value, 0.0 <= value <= 1.0, text, "in [0, 1]")


def top_p(text: str) -> float:
    """Nucleus sampling's mass in (0, 1] (1: off)."""
    value = _float(text)
    return _require(value, 0.0 < value <= 1.0, text, "in (0, 1]")


def cosine(text: str) -> float:
    """A cosine-similarity threshold in [-1, 1]."""
    value = _float(text)
    return _require(value, -1.0 <= value <= 1.0, text, "a cosine similarity in [-1, 1]")
