"""`python cli_recorder.py OUT.npz ARGS...`: run `memllm ARGS...` in this process (exactly what
`python -m memllm_jax.cli ARGS...` does) while recording every batch the training input pipeline
materialises in this process (`train.data.BatchSource`, the grain source), saved to OUT.npz as
`<field>/<batch index>` - the local rows this process fed. Used by `test_distributed_cli.py`."""

import sys

import numpy as np

from memllm_jax.train import data as D

out, argv = sys.argv[1], sys.argv[2:]
seen: dict[int, dict] = {}
_getitem = D.BatchSource.__getitem__


def _recording_getitem(self, index):
    batch = _getitem(self, index)
    seen[int(index)] = batch
    return batch


D.BatchSource.__getitem__ = _recording_getitem

from memllm_jax.cli import main  # noqa: E402

status = main(argv)
np.savez(out, **{f"{k}/{i}": v for i, batch in seen.items() for k, v in batch.items()})
sys.exit(status)
