"""Side-by-side timing: interleave the contenders (A B A B ...), report medians and spreads.

These 2-core machines are shared and noisy, so a benchmark never reports an absolute time alone: it reports
the ratio of medians measured in the same run.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable


@dataclasses.dataclass
class Timing:
    name: str
    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """Half the inter-quartile range relative to the median (0.05 = +-5%)."""
        if len(self.seconds) < 4:
            return (max(self.seconds) - min(self.seconds)) / (2 * self.median)
        q = statistics.quantiles(self.seconds, n=4)
        return (q[2] - q[0]) / (2 * self.median)


def interleaved(contenders: dict[str, Callable[[], object]], repeats: int = 7, warmup: int = 1,
                self_timed: bool = False) -> dict[str, Timing]:
    """Run each contender `warmup` times, then `repeats` rounds of A B C, B C A, C A B, ...; each call must block
    until done. The rotation makes each contender follow each other one equally often, so what a contender
    leaves behind (freed memory, cold caches) does not always land on the same next one. With `self_timed`
    each call returns the seconds it measured itself (`bench.workers`: in its worker process, without the
    pipe's latency) instead of being timed here."""
    for fn in contenders.values():
        for _ in range(warmup):
            fn()
    names = list(contenders)
    timings = {name: Timing(name, []) for name in names}
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = time.perf_counter()
            seconds = contenders[name]()
            timings[name].seconds.append(seconds if self_timed else time.perf_counter() - start)
    return timings


def ratio_row(ours: Timing, peer: Timing) -> str:
    """`ours is N.NNx faster than peer (ours m±s%, peer m±s%)`."""
    return (
        f"{peer.median / ours.median:.2f}x  ({ours.name}: {ours.median * 1e3:.2f} ms ±{ours.spread:.0%}, "
        f"{peer.name}: {peer.median * 1e3:.2f} ms ±{peer.spread:.0%})"
    )


def samples_line(timings: dict[str, Timing]) -> str:
    """Every contender's times in milliseconds, in the order they ran: a spread shows here as outliers, or as two
    modes."""
    return "; ".join(f"{t.name}: " + " ".join(f"{s * 1e3:.0f}" for s in t.seconds) for t in timings.values())


def markdown_table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
