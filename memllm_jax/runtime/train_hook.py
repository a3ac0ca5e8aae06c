"""The training loop's hook for a CPU host that keeps freed memory for reuse (`host_memory`).

`HostMemoryHook` is what `runtime.for_this_host()` attaches to `train.loop.run` on a CPU backend. Before each
step it stops keeping freed memory at the first change of batch shape (length buckets: the kept heap fragments);
after each step it gives the kept pages back when the host's available memory is low or could not hold the
largest one-step rise of the process's memory seen so far (`host_memory.StepRise`). Both say so in the run's log.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from memllm_jax.runtime.host_memory import StepRise, release_if_memory_low, stop_keeping_freed_memory


class HostMemoryHook:
    """The kept heap's fragments and jumps must not exhaust the host (see `host_memory`). Implements the training
    loop's hook methods (`train.hooks.TrainHook`: on_start, before_step, on_step, on_end)."""

    def __init__(self):
        self.say: Callable[[str], None] = print
        self.rise: StepRise | None = None
        self.releases = 0
        self.last_shape: tuple | None = None

    def on_start(self, step: int, say: Callable[[str], None]) -> None:
        """Measure the resident memory from here: the first step's rise (its buffers and compilation) sets the
        first margin."""
        self.say, self.rise, self.releases, self.last_shape = say, StepRise(), 0, None

    def before_step(self, step: int, batch: Mapping[str, Any]) -> None:
        shape = tuple(sorted((k, v.shape) for k, v in batch.items()))
        if self.last_shape not in (None, shape) and stop_keeping_freed_memory():
            self.say(f"step {step}: the batch shape changes (length buckets): freed memory no longer kept for reuse "
                     "(glibc's malloc defaults from here on)")
        self.last_shape = shape

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        if release_if_memory_low(need_bytes=self.rise.need_bytes()):
            self.rise.released()
            self.releases += 1
            if self.releases in (1, 10, 100):
                self.say(f"step {step}: host memory low, freed memory kept for reuse given back (malloc_trim; "
                         f"{self.releases} time{'s' if self.releases > 1 else ''} so far; a step rose by up to "
                         f"{self.rise.largest / 1e9:.1f} GB)")

    def on_end(self, step: int) -> None:
        """Nothing to undo: the process keeps its malloc settings (the pipeline gives the pages back between
        stages, `runtime.after_stage`)."""
