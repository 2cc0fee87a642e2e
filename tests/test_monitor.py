"""ScaleMonitor and plot_scales: telemetry in logs, History, TensorBoard and PNG."""

import glob

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als import policies
from tests import models


class LastLogs(keras.callbacks.Callback):
    """Keeps the batch logs that callbacks after the monitor see."""

    def __init__(self):
        super().__init__()
        self.batches = []

    def on_train_batch_end(self, batch, logs=None):
        self.batches.append(dict(logs))


WHOLE_MODEL = {
    "scale_min",
    "scale_max",
    "skipped_steps",
    "recent_skip_rate",
    "skipped_in_a_row",
    "scaling_stuck",
    "layers_beyond_float16",
    "layers_needing_float32",
}


def monitored_fit(
    tmp_path, policy="max_safe", depth=8, every=1, epochs=2, jit_compile=False, **monitor_args
):
    """A deep sigmoid MLP trained under mixed_float16 with a `ScaleMonitor`
    (in a TensorFlow graph unless `jit_compile`: the monitor reads the same
    variables either way; the tests of its numbers compile with XLA)."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model, x, y = models.deep_sigmoid_mlp(depth=depth)
        model = keras_als.wrap_model(model)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01), policy=policy)
        model.compile(optimizer=optimizer, loss="mse", jit_compile=jit_compile)
        monitor = keras_als.ScaleMonitor(
            log_dir=str(tmp_path / "logs"), every_n_steps=every, **monitor_args
        )
        seen = LastLogs()
        history = model.fit(
            x, y, batch_size=16, epochs=epochs, verbose=0, callbacks=[monitor, seen]
        )
    finally:
        keras.config.set_dtype_policy("float32")
    return model, optimizer, monitor, seen, history


def test_logs_carry_whole_model_numbers_and_history_and_tensorboard_the_per_layer_ones(
    tmp_path,
):
    _, optimizer, monitor, seen, history = monitored_fit(tmp_path, every=2, jit_compile=True)
    steps = 2 * 4  # 2 epochs of 64 / 16 batches
    assert len(seen.batches) == steps
    for logs in seen.batches:
        assert set(logs) == {"loss"} | WHOLE_MODEL  # no per-layer key in the progress bar
        assert logs["scale_min"] <= logs["scale_max"] and logs["skipped_steps"] == 0
    final = optimizer.layer_scales()
    assert len(final) == 10  # the loss's and 9 Dense layers': 50 numbers kept out of logs
    assert seen.batches[-1]["scale_max"] == max(final.values())  # step 8: a refresh
    assert set(history.history) == {"loss"} | WHOLE_MODEL  # per epoch, for CSVLogger too
    assert history.history["scale_min"][-1] == min(final.values())
    assert history.history["scale_max"][-1] == max(final.values())
    assert monitor.history["step"] == [2, 4, 6, 8]
    assert monitor.history["scale/loss"][-1] == final["loss"]

    events = glob.glob(str(tmp_path / "logs" / "events.out.tfevents.*"))
    assert events
    read = {}
    for event in tf.compat.v1.train.summary_iterator(events[0]):
        for value in event.summary.value:
            read.setdefault(value.tag, []).append(
                (event.step, float(tf.make_ndarray(value.tensor)))
            )
    for name in final:
        expected = list(zip(monitor.history["step"], monitor.history[f"scale/{name}"]))
        assert read[f"scale/{name}"] == expected
        assert [s for s, _ in read[f"underflow/{name}"]] == monitor.history["step"]


def test_underflow_estimate_is_high_where_the_scale_is_too_small(tmp_path):
    fixed = policies.Fixed(default=1.0)
    low = monitored_fit(tmp_path / "low", policy=fixed, depth=12, jit_compile=True)[2]
    adaptive = monitored_fit(tmp_path / "adaptive", depth=12, jit_compile=True)[2]
    # The second layer's input gradients are the smallest that are computed
    # (nothing needs the first layer's); at scale 1 most of them flush to zero
    # and what is left sits in float16's subnormal range (all of it flushes
    # after a few updates: the largest record, of the measuring steps).
    assert low.history["zeros/dense_1"][-1] > 0.5
    assert max(low.history["underflow/dense_1"]) > 5e-3
    assert max(low.history["underflow/dense_8"]) > 5e-3
    # The first two records are at the first guess (2**15 everywhere: the
    # first step measures the initial weights' gradients and raises no
    # scale), where the bottom layers do underflow; once measured after an
    # update, nothing does.
    assert min(adaptive.history["underflow/dense_13"][:2]) > 0.1  # the adaptive model's bottom
    for key, values in adaptive.history.items():
        if key.startswith("underflow/"):
            assert all(0.0 <= v < 1e-3 for v in values[2:]), key


def test_log_per_layer_adds_the_per_layer_numbers_to_each_epoch_s_logs(tmp_path):
    _, optimizer, monitor, _, history = monitored_fit(tmp_path, every=2, log_per_layer=True)
    final = optimizer.layer_scales()
    kinds = (
        "scale",
        "underflow",
        "zeros",
        "headroom",
        "overflows",
        "beyond_float16",
        "needs_float32",
    )
    per_layer = {f"{kind}/{name}" for kind in kinds for name in final}
    assert set(history.history) == {"loss"} | WHOLE_MODEL | per_layer
    for name, scale in final.items():
        assert history.history[f"scale/{name}"][-1] == scale
        assert history.history[f"underflow/{name}"][-1] == monitor.history[f"underflow/{name}"][-1]


@pytest.mark.parametrize("source", ["monitor", "history", "log_dir"])
def test_plot_scales_renders_a_png_from_every_source(tmp_path, source):
    _, _, monitor, _, history = monitored_fit(tmp_path, log_per_layer=source == "history")
    given = {"monitor": monitor, "history": history, "log_dir": str(tmp_path / "logs")}[source]
    path = tmp_path / "scales.png"
    figure = keras_als.plot_scales(given, path)
    assert len(figure.axes) == 3  # scales, heatmap, colour bar
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000


def test_monitor_and_plot_refuse_what_they_cannot_read():
    with pytest.raises(ValueError, match="every_n_steps"):
        keras_als.ScaleMonitor(every_n_steps=0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(), "mse")
    with pytest.raises(
        ValueError, match=r"ScaleMonitor needs a keras_als.AdaptiveLossScaleOptimizer"
    ):
        model.fit(np.ones((4, 2)), np.ones((4, 1)), verbose=0, callbacks=[keras_als.ScaleMonitor()])
    with pytest.raises(TypeError, match="ScaleMonitor"):
        keras_als.plot_scales(42)
    with pytest.raises(ValueError, match="ScaleMonitor"):
        keras_als.plot_scales(keras.callbacks.History())
