"""What the training loop calls besides its own work (levanter's `trainer.add_hook` in spirit).

`train.loop.run(cfg, hooks=[...])` calls, on each hook in turn: `on_start(step, say)` before the first step (after
the initial evaluation; `step` is the number of steps already done, `say` writes a line to the run's log),
`before_step(step, batch)` with the host batch of step `step` (1-based) before it runs, `on_step(step, metrics)`
after step `step` with its finite metrics (before they are logged), and `on_end(step)` when the run ends or stops
(`step`: the steps done; also after an error). `TrainHook` is a base with nothing in each; an object of any class
with the four methods will do (the runtime's hooks, `memllm_jax.runtime`, sit below this package).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping


class TrainHook:
    """Override the calls you need."""

    def on_start(self, step: int, say: Callable[[str], None]) -> None:
        pass

    def before_step(self, step: int, batch: Mapping[str, Any]) -> None:
        pass

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        pass

    def on_end(self, step: int) -> None:
        pass


class HookList(TrainHook):
    """Several hooks called in order as one."""

    def __init__(self, hooks: Iterable[Any] = ()):
        self.hooks = list(hooks)

    def on_start(self, step: int, say: Callable[[str], None]) -> None:
        for hook in self.hooks:
            hook.on_start(step, say)

    def before_step(self, step: int, batch: Mapping[str, Any]) -> None:
        for hook in self.hooks:
            hook.before_step(step, batch)

    def on_step(self, step: int, metrics: Mapping[str, float]) -> None:
        for hook in self.hooks:
            hook.on_step(step, metrics)

    def on_end(self, step: int) -> None:
        for hook in self.hooks:
            hook.on_end(step)
