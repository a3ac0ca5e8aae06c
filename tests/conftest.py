"""Test setup (before jax is imported): 8 fake CPU devices, LLVM optimisation off, one compilation cache for the
session, offline Hugging Face, a temporary HF_HOME."""

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
if "HF_HOME" not in os.environ:  # a fresh, empty cache per test session, removed when it ends
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="memllm_hf_home_")
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    # One persistent compilation cache for the session, shared by the xdist workers (they inherit this
    # environment): many tests compile the same small programs (the tiny model's forwards, steps and loops),
    # and a program one test compiled is read back by the next. Removed when the session ends.
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="memllm_xla_cache_")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
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
