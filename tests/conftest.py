"""Test setup (before jax is imported): 8 fake CPU devices, LLVM optimisation off, one compilation cache for the
test run, offline Hugging Face, a temporary HF_HOME."""

import atexit
import os
import pathlib
import shutil
import tempfile

_flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    # LLVM's optimisation off: most test programs compile for seconds and run for milliseconds, so compiling is
    # most of the suite's time (docs/results_log.md has the measurement). XLA's HLO passes still run, and LLVM's
    # passes keep IEEE semantics at every level; the job itself (`memllm run`) compiles at XLA's default level.
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


def _run_dir(variable: str, prefix: str) -> None:
    """Point `variable` at a fresh, empty directory for this test run, removed when the run ends; the xdist
    workers inherit it. Left as it is when already set."""
    if variable not in os.environ:
        os.environ[variable] = tempfile.mkdtemp(prefix=prefix)
        atexit.register(shutil.rmtree, os.environ[variable], ignore_errors=True)


_run_dir("HF_HOME", "memllm_hf_home_")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent compilation cache for the run, shared by the workers: many tests compile the same small programs
# (the tiny model's forwards, steps and loops), and a program one test compiled is read back by the next.
_run_dir("JAX_COMPILATION_CACHE_DIR", "memllm_xla_cache_")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.1")

import pytest  # noqa: E402

SHARED_DATA = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "data"


@pytest.fixture
def shared_data() -> pathlib.Path:
    """`../shared/data`; tests using it skip cleanly when it is absent (as on a user's fresh machine)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


def pytest_collection_modifyitems(config, items):
    """The units one worker runs whole (`xdist_group`: modules with costly fixtures, the longest single tests) first:
    `--dist loadgroup` hands units out in collection order, so none of them is left running alone at the end."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)
