"""tf.distribute: each check runs in its own processes (see tests/distributed/).

MirroredStrategy needs 2 logical CPU devices, configured before TensorFlow
starts, and MultiWorkerMirroredStrategy needs 2 worker processes, so neither
can run inside the pytest process.
"""

import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
ROOT = HERE.parent


def run(script, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, str(HERE / "distributed" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


@pytest.mark.slow
def test_mirrored_strategy_trains_like_one_device_and_skips_on_every_replica_together():
    out = run("mirrored.py")
    assert "fit float32: 2 replicas vs 1 device" in out
    assert "both replicas skipped that step" in out
    assert "mirrored: all checks passed" in out


@pytest.mark.slow
def test_mirrored_strategy_writes_the_same_telemetry_on_every_replica():
    out = run("mirrored.py", "telemetry")
    assert "the same on both" in out
    assert "mirrored: all checks passed" in out


@pytest.mark.slow
def test_multi_worker_mirrored_strategy_matches_one_process():
    out = run("multi_worker.py")
    assert "multi_worker: all checks passed" in out
