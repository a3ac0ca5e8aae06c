"""The padded shapes of the jitted decoding and scoring calls. Every padded length comes from here: a new batch or a
memory round trip reuses a few compiled shapes.

Three rules, each where its padding costs what it does: token widths of a prefill grow by quarter octaves (`bucket`:
prefill is compute-bound, so at most ~1/5 padding); the slots a read chunk attends to and the caches of greedy
generation double (`doubled`); write caches and scoring widths are multiples of a quantum (`round_up`: few distinct
sizes across prompts of any length). Changing a rule changes the compiled shapes, and with them possibly the
rounding of a padded computation.
"""

from __future__ import annotations

MIN_BUCKET = 8


def bucket(n: int, cap: int | None = None) -> int:
    """Smallest value >= n of 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ... (four steps per power of two, at
    least MIN_BUCKET): few distinct prefill shapes, and at most ~1/5 of a prefill is padding (plain
    powers of two waste up to half, e.g. 129 tokens -> 256; prefill is compute-bound, so padding costs
    its full share)."""
    b = MIN_BUCKET
    while b < n:
        b += 1 << max(0, (b.bit_length() - 1) - 2)
    return b if cap is None else max(min(b, cap), n)


def round_up(n: int, quantum: int = 64) -> int:
    """`n` rounded up to a multiple of `quantum`, at least `quantum`."""
    return max(quantum, -(-n // quantum) * quantum)


def cache_slots(longest_prompt: int, max_new_tokens: int) -> int:
    """Cache length for prompts of up to `longest_prompt` tokens and their calls, rounded up to a multiple of 64
    (few distinct cache sizes, so few compiles)."""
    return round_up(longest_prompt + max_new_tokens + 1, 64)


def doubled(n: int, start: int) -> int:
    """The smallest `start * 2**k` (k >= 0) that is at least `n`."""
    b = start
    while b < n:
        b *= 2
    return b


def attend_window(longest: int, chunk: int, max_len: int) -> int | None:
    """The cache slots a read chunk attends to: the smallest doubling of `2 * MIN_BUCKET` that holds the longest
    row plus the whole chunk; None when that is not below `max_len` (the whole cache)."""
    attend = doubled(longest + chunk, 2 * MIN_BUCKET)
    return attend if attend < max_len else None
