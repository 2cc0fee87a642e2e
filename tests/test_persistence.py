"""Checkpoints restore everything, and a killed run resumes to the same weights."""

import os
import pathlib
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als.step import _state
from tests import models

SCRIPT = pathlib.Path(__file__).parent / "persistence" / "killed_run.py"
ROOT = SCRIPT.parent.parent.parent


def run(mode, folder, kill_at=None):
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    args = [sys.executable, str(SCRIPT), mode, str(folder)] + ([str(kill_at)] if kill_at else [])
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fit", "loop"])
def test_a_run_killed_mid_epoch_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path, mode):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    whole.mkdir(), killed.mkdir()
    uninterrupted = run(mode, whole)
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    interrupted = run(mode, killed, kill_at=11)  # epoch 2 of 3, batch 5 of 6
    assert interrupted.returncode == -signal.SIGKILL
    assert not (killed / "final.npz").exists()
    saved = dict(np.load(killed / "saved.npz"))  # the last checkpoint before the kill
    resumed = run(mode, killed)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    # The resumed process started from that checkpoint, not afresh (seeded, a
    # fresh start would reach the same final weights): its position, its
    # optimizer's iterations, weights and layer scales are the checkpoint's.
    fresh, start = np.load(whole / "start.npz"), np.load(killed / "start.npz")
    assert int(fresh["position"]) == 0
    assert int(start["position"]) == {"fit": 1, "loop": 9}[mode]  # epoch 1 / step 9
    assert int(start["iterations"]) > 0 == int(fresh["iterations"])
    assert sorted(start.files) == sorted(saved)
    for key in start.files:
        np.testing.assert_array_equal(start[key], saved[key], err_msg=key)
    assert not np.array_equal(start["arr_0"], fresh["arr_0"])  # the first kernel
    # mixed_float16: the scales were measured and moved from the first guess.
    assert set(fresh["scales"]) == {2.0**15}
    assert set(start["scales"]) != {2.0**15}, start["scales"]

    expected, actual = np.load(whole / "final.npz"), np.load(killed / "final.npz")
    assert expected.files == actual.files
    for key in expected.files:
        np.testing.assert_array_equal(actual[key], expected[key], err_msg=key)


def _trained(policy="max_safe"):
    model, x, y = models.sequential_mlp()
    model = keras_als.wrap_model(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(), policy=policy)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    return model, optimizer


def test_tf_checkpoint_restores_every_scale_and_the_skip_count(tmp_path):
    model, optimizer = _trained()
    table = optimizer.scaling.table().numpy()
    table[_state.PER_SCALE.index("scale")] = [2.0 ** (3 + 5 * i) for i in range(table.shape[1])]
    counters = optimizer.scaling.counters().numpy()
    counters[_state.COUNTERS.index("skipped_steps")] = 4
    optimizer.scaling.assign(table, counters)
    optimizer.dynamic_scale.assign(2.0**-7)
    saved = optimizer.layer_scales()
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

    for variable in optimizer.variables:
        variable.assign(tf.zeros_like(variable))
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(path).assert_consumed()
    assert optimizer.layer_scales() == saved
    assert int(optimizer.skipped_steps.numpy()) == 4


def test_keras_file_restores_scales_and_the_next_step_is_the_same(tmp_path):
    model, optimizer = _trained()
    table = optimizer.scaling.table().numpy()
    table[_state.PER_SCALE.index("scale")] = [2.0 ** (2 + 3 * i) for i in range(table.shape[1])]
    optimizer.scaling.assign(table)
    model.save(tmp_path / "m.keras")
    loaded = keras_als.wrap_model(keras.models.load_model(tmp_path / "m.keras"))
    assert loaded.optimizer.layer_scales() == optimizer.layer_scales()
    _, x, y = models.sequential_mlp()
    model.train_on_batch(x[:16], y[:16])
    loaded.train_on_batch(x[:16], y[:16])
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert loaded.optimizer.layer_scales() == optimizer.layer_scales()
