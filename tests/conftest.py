"""Test setup: 8 fake CPU devices (set before jax is imported), offline Hugging Face, temp HF_HOME."""

import atexit
import os
import pathlib
import shutil
import tempfile

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
if "HF_HOME" not in os.environ:  # a fresh, empty cache per test process, removed when it exits
    os.environ["HF_HOME"] = tempfile.mkdtemp(prefix="memllm_hf_home_")
    atexit.register(shutil.rmtree, os.environ["HF_HOME"], ignore_errors=True)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

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
