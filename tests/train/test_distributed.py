"""Two local processes x 4 fake CPU devices (gloo collectives) train exactly like one process x 8 devices:
same losses and final parameters on a (2, 4, 1) mesh, each process feeding only its own rows."""

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest

WORKER = pathlib.Path(__file__).with_name("distributed_worker.py")
TIMEOUT_S = 300


def _run(n_processes: int, out: pathlib.Path) -> None:
    port = portpicker.pick_unused_port()
    env = {**os.environ, "PYTHONPATH": str(WORKER.parents[2])}
    env.pop("XLA_FLAGS", None)
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(n_processes), str(i), str(port), str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for i in range(n_processes)]
    deadline = time.monotonic() + TIMEOUT_S
    try:
        logs = [p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0].decode(errors="replace")
                for p in procs]
    finally:
        for p in procs:  # always reaped, also on a timeout or a failed peer
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]


@pytest.mark.slow
def test_two_processes_train_like_one(tmp_path):
    _run(2, tmp_path / "two.npz")
    _run(1, tmp_path / "one.npz")
    two, one = np.load(tmp_path / "two.npz"), np.load(tmp_path / "one.npz")
    assert set(two.files) == set(one.files) and len(one.files) > 10
    assert one["losses"][-1] < one["losses"][0]
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5)
    for key in one.files:
        np.testing.assert_allclose(two[key], one[key], atol=1e-5, err_msg=key)
