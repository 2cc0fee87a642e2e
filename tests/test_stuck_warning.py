"""The stuck-scaling warning: a model driven into skipping every step, or many.

Skipped steps change no weight, so a run whose scaling is stuck trains nothing
while looking busy. keras_als says so once, with where the overflows started
and the usual causes, in `telemetry()["warning"]`, as a `UserWarning`, and in
`ScaleMonitor`'s logs; it never raises or stops training.
"""

import warnings

import keras
import numpy as np
import pytest

import keras_als
from keras_als.telemetry import _telemetry

BATCH = 8


def _fit(x, y, *, warn_after=20, every=1):
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras_als.wrap_model(
            keras.Sequential(
                [
                    keras.Input((4,)),
                    keras.layers.Dense(8, activation="tanh", name="hidden"),
                    keras.layers.Dense(1, dtype="float32", name="out"),
                ]
            )
        )
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.SGD(0.01), warn_after_skipped_steps=warn_after
        )
        model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
        before = [w.copy() for w in model.get_weights()]
        monitor = keras_als.ScaleMonitor(every_n_steps=every)
        seen = []
        keep = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs=None: seen.append(dict(logs))
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0, callbacks=[monitor, keep])
    finally:
        keras.config.set_dtype_policy("float32")
    stuck = [w for w in caught if "loss scaling looks stuck" in str(w.message)]
    return model, optimizer, before, seen, stuck


def test_nan_in_the_data_makes_every_step_skip_and_warns_once_with_the_causes():
    """30 batches, all holding a NaN: 30 skips, weights untouched, one warning
    from the 20th skip in a row on, naming NaN data as the first cause."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30 * BATCH, 4)).astype("float32")
    x[::BATCH, 0] = np.nan  # one row of every batch
    y = rng.normal(size=(30 * BATCH, 1)).astype("float32")
    model, optimizer, before, logs, stuck = _fit(x, y)
    telemetry = optimizer.telemetry()
    assert telemetry["skipped_steps"] == 30 and telemetry["skipped_in_a_row"] == 30
    for old, new in zip(before, model.get_weights()):
        np.testing.assert_array_equal(old, new)
    assert len(stuck) == 1
    message = str(stuck[0].message)
    assert "the last 20 steps were all skipped (since step 0)" in message
    assert "NaN or Inf in the input data" in message
    assert "learning rate" in message
    assert telemetry["warning"].startswith("keras_als: loss scaling looks stuck: the last 30")
    # NaN data make the loss itself not finite: every skipped step is marked so.
    assert telemetry["loss_not_finite"] == 30
    assert "The loss itself was not finite on 20 of the last 20 steps" in message
    assert [log["scaling_stuck"] for log in logs[:19]] == [0.0] * 19
    assert logs[19]["scaling_stuck"] == 1.0 and logs[-1]["skipped_in_a_row"] == 30


def test_the_number_of_skips_in_a_row_is_configurable():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6 * BATCH, 4)).astype("float32")
    x[:, 0] = np.inf
    y = np.zeros((6 * BATCH, 1), "float32")
    *_, logs, stuck = _fit(x, y, warn_after=5)
    assert len(stuck) == 1 and "the last 5 steps were all skipped" in str(stuck[0].message)
    assert [log["scaling_stuck"] for log in logs] == [0.0] * 4 + [1.0, 1.0]


def test_a_large_share_of_skipped_steps_warns_though_none_follow_each_other():
    """Every third of 120 batches holds a NaN: never two skips in a row, but a
    third of the last 100 steps skipped, above the quarter that warns."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(120 * BATCH, 4)).astype("float32")
    x[:: 3 * BATCH, 1] = np.nan
    y = rng.normal(size=(120 * BATCH, 1)).astype("float32")
    _, optimizer, _, logs, stuck = _fit(x, y)
    telemetry = optimizer.telemetry()
    assert telemetry["skipped_steps"] == 40 and telemetry["skipped_in_a_row"] <= 1
    assert len(stuck) == 1
    assert "% of the last 100 steps were skipped" in str(stuck[0].message)
    assert telemetry["recent_skip_rate"] == pytest.approx(0.33, abs=0.011)


def test_clean_training_never_warns():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(40 * BATCH, 4)).astype("float32")
    y = rng.normal(size=(40 * BATCH, 1)).astype("float32")
    _, optimizer, _, logs, stuck = _fit(x, y)
    assert stuck == [] and optimizer.telemetry()["warning"] is None
    assert all(log["scaling_stuck"] == 0.0 for log in logs)


def test_telemetry_without_warnings_reads_the_same_numbers_and_says_nothing():
    """`telemetry(warn=False)` (what `Float32Fallback` reads) leaves the stuck
    warning to the next `telemetry()`, which gives it once."""
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    optimizer.build([keras.Variable(np.ones(2, "float32"))])
    masks = optimizer.scaling.counter_masks()
    values = {"skipped_steps": 20, "skipped_in_a_row": 20}
    optimizer.scaling.assign(new_counters=optimizer.scaling.counters_with(masks, values=values))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        quiet = optimizer.telemetry(warn=False)
        said = [str(w.message) for w in caught if w.category is UserWarning]
        assert said == [] and optimizer.skipped_step_count() == 20
        assert quiet == optimizer.telemetry()
    assert quiet["warning"].startswith("keras_als: loss scaling looks stuck: the last 20")
    assert [str(w.message) for w in caught if w.category is UserWarning] == [quiet["warning"]]


@pytest.mark.parametrize("argument", ["warn_after_skipped_steps", "measure_every_n_steps"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True, "20"])
def test_counts_that_are_not_whole_numbers_of_at_least_one_are_refused(argument, value):
    with pytest.raises(ValueError, match=f"{argument} must be a whole number >= 1"):
        keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(), **{argument: value})


def test_the_stuck_warning_names_the_float32_tools_where_most_skipped_losses_were_not_finite():
    numbers = {
        "scale": {"loss": 2.0**15},
        "last_overflow_step": {"loss": -1},
        "skipped_in_a_row": 20,
        "recent_skip_rate": 0.4,
        "steps": 50,
        "loss_not_finite": 10,
    }
    message = _telemetry.stuck(numbers, in_a_row_limit=20)
    assert "The loss itself was not finite on 10 of the last 50 steps" in message
    assert "keras_als.diagnose(model, x, y)" in message
    assert "keras_als.Float32Fallback(x, y)" in message
    # 9 of 20 skipped steps: most were skipped for their gradients.
    numbers["loss_not_finite"] = 9
    message = _telemetry.stuck(numbers, in_a_row_limit=20)
    assert "The loss itself" not in message and "Float32Fallback" not in message
    assert "The usual causes: NaN or Inf in the input data" in message


@pytest.mark.slow
def test_t5_whose_float16_loss_is_nan_is_said_to_have_a_loss_not_finite_and_the_fix_named():
    """A tiny KerasHub T5 under mixed_float16 and plain `fit`, no callback:
    its padding mask's -1e9 is -inf in float16, so the loss is NaN on every
    step (float32 trains it). The stuck warning at the end of `fit` says the
    loss itself was not finite and names `diagnose` and `Float32Fallback`."""
    from benchmarks.harness import hub_tasks

    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras_als.wrap_model(hub_tasks.t5_seq2seq_lm())
        x, y = hub_tasks.seq2seq_batches(64)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
        sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        model.compile(optimizer=optimizer, loss=sparse, jit_compile=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            losses = model.fit(x, y, batch_size=8, epochs=3, verbose=0).history["loss"]
    finally:
        keras.config.set_dtype_policy("float32")
    assert np.isnan(losses).all()
    telemetry = optimizer.telemetry(warn=False)
    assert telemetry["skipped_steps"] == telemetry["loss_not_finite"] == 24
    [stuck] = [str(w.message) for w in caught if "loss scaling looks stuck" in str(w.message)]
    assert "The loss itself was not finite on 24 of the last 24 steps" in stuck
    assert "keras_als.diagnose(model, x, y)" in stuck
    assert "keras_als.Float32Fallback(x, y)" in stuck
