"""Where the real data and weights are: environment variables, each with this checkout's development default.

MEMLLM_REDOCRED   folder of Re-DocRED's train_revised.json / dev_revised.json / test_revised.json
MEMLLM_DOCRED     folder of DocRED's rel_info.json
MEMLLM_ZSRE       a ZsRE file in the MEND/ROME evaluation format
MISTRAL_7B_DIR    an HF directory of Mistral-7B-v0.1 (config.json, safetensors, tokenizer)
"""

import os
import pathlib

_SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"


def redocred(split: str) -> str:
    """Re-DocRED's `split` file ("train", "dev" or "test")."""
    return str(pathlib.Path(os.environ.get("MEMLLM_REDOCRED", _SHARED / "redocred")) / f"{split}_revised.json")


def docred_labels() -> str:
    return str(pathlib.Path(os.environ.get("MEMLLM_DOCRED", _SHARED / "docred")) / "rel_info.json")


def zsre() -> str:
    return os.environ.get("MEMLLM_ZSRE", str(_SHARED / "zsre" / "zsre_dev200.json"))


def mistral_7b() -> str:
    return os.environ.get("MISTRAL_7B_DIR", "checkpoints/mistral-7b-v0.1")
