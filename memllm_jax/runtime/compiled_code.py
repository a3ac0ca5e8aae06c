"""Give compiled XLA executables back before the process runs out of memory mappings.

XLA:CPU maps the code and data of each compiled kernel into the process separately: ~140 mappings for a jitted
function of 40 small ops (measured here), far more for a 30-layer forward. A jitted function's executables live
as long as the function: those of the module-level decoding loops (`decode.loop`, `decode.writer`,
`decode.refill`) for the life of the process. Linux caps a process's mappings at `vm.max_map_count`
(65,530 by default); past the cap every `mmap` fails, and the next compilation aborts the whole process ("LLVM
ERROR: Unable to allocate section memory!").

`memllm run --config smollm2_redocred` can die that way in Table 2's first row whose reads the model places
(round 25). The same process had trained both adapters and written the memories. Run alone in a new
process, the Table 2 stage peaked at ~27,500 mappings in that row (its scorers' executables freed with them at
the row's end), so the earlier stages had left at least ~38,000.

`release_if_many_mappings` drops every compiled executable (`jax.clear_caches`) once the process holds more than
half the cap. The pipeline calls it after each stage (`runtime.after_stage`), and Table 2 after each read round.
Shapes still in use compile again, from the persistent compilation cache when one is set.
"""

from __future__ import annotations

import gc
from typing import Callable

MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"
OWN_MAPS = "/proc/self/maps"


def mapping_limit() -> int | None:
    """The kernel's cap on a process's memory mappings (None where it cannot be read, e.g. off Linux)."""
    try:
        with open(MAX_MAP_COUNT) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def mapping_count() -> int | None:
    """How many memory mappings this process holds (None where it cannot be read)."""
    try:
        with open(OWN_MAPS, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def release_if_many_mappings(say: Callable[[str], None] | None = None, fraction: float = 0.5) -> bool:
    """Clear JAX's caches of compiled executables when this process holds more than `fraction` of the mapping
    cap; True when it did."""
    limit, count = mapping_limit(), mapping_count()
    if limit is None or count is None or count <= fraction * limit:
        return False
    import jax  # here, not at the top: `memllm run --help` imports the runtime, and must not wait for jax

    jax.clear_caches()
    gc.collect()
    if say is not None:
        after = mapping_count()
        say(f"  compiled code released: {count:,} of the process's {limit:,} memory mappings in use, {after:,} after")
    return True
