"""Mistakes a user can make get an error or a warning that names the fix."""

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from tests import models


def _caught(action) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return [str(w.message) for w in caught if "keras_als" in str(w.message)]


def _mlp(wrap: bool):
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, name="hidden"), keras.layers.Dense(1, name="out")]
    )
    return keras_als.wrap_model(model) if wrap else model


def test_skips_are_never_silent_under_plain_fit_and_the_warning_names_where_they_started():
    """NaN in every batch: no ScaleMonitor, no call of telemetry(); the end of
    fit says once that the scaling is stuck, with the layers it started in."""
    keras.config.set_dtype_policy("mixed_float16")
    model = _mlp(wrap=True)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.01), warn_after_skipped_steps=5
    )
    model.compile(optimizer, "mse")
    x = np.full((64, 4), 1e30, "float32")  # overflows float16 in the first layer

    messages = _caught(lambda: model.fit(x, np.ones((64, 1)), batch_size=8, epochs=1, verbose=0))
    stuck = [m for m in messages if "looks stuck" in m]
    assert len(stuck) == 1, messages
    assert "overflows started in: hidden" in stuck[0] or "all skipped" in stuck[0], stuck
    assert int(optimizer.skipped_steps.numpy()) == 8
    again = _caught(lambda: model.fit(x, np.ones((64, 1)), batch_size=8, epochs=1, verbose=0))
    assert not [m for m in again if "looks stuck" in m]  # once


def test_a_healthy_fit_says_nothing():
    model, x, y = models.sequential_mlp()
    keras_als.wrap_model(model)
    model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01)), "mse")
    assert _caught(lambda: model.fit(x, y, epochs=2, verbose=0)) == []


def test_an_optimizer_on_a_model_never_wrapped_warns_naming_wrap_model():
    model = _mlp(wrap=False)
    model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01)), "mse")
    messages = _caught(lambda: model.fit(np.ones((16, 4)), np.ones((16, 1)), epochs=2, verbose=0))
    assert len([m for m in messages if "keras_als.wrap_model(model)" in m]) == 1, messages


def test_apply_traced_without_scale_loss_warns_that_every_update_is_too_small():
    model = _mlp(wrap=True)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01))
    x = tf.ones((4, 4))

    @tf.function
    def forgot_scale_loss():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    messages = _caught(forgot_scale_loss)
    assert any("without scale_loss()" in m and "optimizer.scale_loss(loss)" in m for m in messages)


def test_the_inner_optimizer_can_be_named_as_compile_takes_it():
    optimizer = keras_als.AdaptiveLossScaleOptimizer("adam")
    assert type(optimizer.inner_optimizer) is keras.optimizers.Adam
    with pytest.raises(TypeError, match=r"keras\.optimizers\.Optimizer"):
        keras_als.AdaptiveLossScaleOptimizer(3)


@pytest.mark.parametrize("user", ["ScaleMonitor", "Float32Fallback", "keras_als.calibrate"])
def test_what_reads_keras_als_s_optimizer_refuses_keras_s_with_one_error_and_fix(user):
    model = _mlp(wrap=True)
    model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD()), "mse")
    x, y = np.ones((4, 4), "float32"), np.ones((4, 1), "float32")
    run = {
        "ScaleMonitor": lambda: model.fit(x, y, verbose=0, callbacks=[keras_als.ScaleMonitor()]),
        "Float32Fallback": lambda: model.fit(
            x, y, verbose=0, callbacks=[keras_als.Float32Fallback(x, y)]
        ),
        "keras_als.calibrate": lambda: keras_als.calibrate(model, x, y),
    }[user]
    fix = (
        rf"^{user} needs a keras_als.AdaptiveLossScaleOptimizer: compile the model with "
        r"optimizer=keras_als.AdaptiveLossScaleOptimizer\(\.\.\.\)"
    )
    with pytest.raises(ValueError, match=fix) as refused:
        run()
    assert str(refused.value).endswith("; got LossScaleOptimizer.")


@pytest.mark.parametrize("argument", ["clipnorm", "global_clipnorm", "clipvalue", "weight_decay"])
def test_clipping_given_to_the_outer_optimizer_is_refused_naming_the_inner_one(argument):
    fix = rf"{argument}.*inner_optimizer.*Adam\({argument}=\.\.\.\)"
    with pytest.raises(ValueError, match=fix):
        keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(), **{argument: 1.0})


def test_summary_prints_a_line_per_scale_with_its_power_of_two():
    model = _mlp(wrap=True)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer, "mse")
    model.fit(np.ones((16, 4)), np.ones((16, 1)), epochs=1, verbose=0)
    lines = []
    optimizer.summary(print_fn=lines.append)
    rows = lines[0].splitlines()
    assert [row.split()[0] for row in rows[1:4]] == ["loss", "hidden", "out"]
    for row in rows[1:4]:
        name, value = row.split()[:2]
        assert 2.0 ** int(value[3:]) == optimizer.layer_scales()[name]
    assert rows[-1] == "skipped steps: 0 of 1"  # 16 examples, one batch of 32


def test_estimate_underflow_is_an_argument_kept_in_the_config():
    optimizer = keras_als.AdaptiveLossScaleOptimizer("sgd", estimate_underflow=True)
    restored = keras_als.AdaptiveLossScaleOptimizer.from_config(optimizer.get_config())
    assert restored.estimate_underflow is True
