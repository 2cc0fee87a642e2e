"""Bad data and odd models never corrupt a run."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als import policies


@pytest.fixture
def mixed():
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy("float32")


def regression_data(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 12)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(12, 3))).astype("float32")
    return x, y


def mlp():
    return keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((12,)),
                keras.layers.Dense(32, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(32, activation="sigmoid"),
                keras.layers.Dense(3, dtype="float32"),
            ]
        )
    )


def training_step(model, optimizer):
    @tf.function(jit_compile=True)
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
            scaled = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)
        return loss

    return step


def snapshot(model, optimizer):
    return [w.copy() for w in model.get_weights()] + [
        v.numpy().copy() for v in optimizer.inner_optimizer.variables
    ]


def assert_unchanged(model, optimizer, before):
    for a, b in zip(snapshot(model, optimizer), before, strict=True):
        np.testing.assert_array_equal(a, b)


BAD_BATCHES = {
    "nan_inputs": lambda x, y: (np.where(np.arange(x.size).reshape(x.shape) == 5, np.nan, x), y),
    "inf_inputs": lambda x, y: (np.full_like(x, np.inf), y),
    "nan_labels": lambda x, y: (x, np.full_like(y, np.nan)),
    "inf_labels": lambda x, y: (x, np.where(np.arange(y.size).reshape(y.shape) == 0, np.inf, y)),
}


@pytest.mark.parametrize("kind", sorted(BAD_BATCHES))
def test_a_non_finite_batch_is_skipped_and_leaves_weights_and_slots_unchanged(mixed, kind):
    x, y = regression_data()
    model, optimizer = mlp(), keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
    step = training_step(model, optimizer)
    for i in range(0, 160, 32):
        step(x[i : i + 32], y[i : i + 32])
    before = snapshot(model, optimizer)
    step(*BAD_BATCHES[kind](x[160:192], y[160:192]))
    assert int(optimizer.skipped_steps.numpy()) == 1
    assert_unchanged(model, optimizer, before)
    losses = [float(step(x[i : i + 32], y[i : i + 32])) for i in range(192, 512, 32)]
    assert int(optimizer.skipped_steps.numpy()) == 1
    assert all(math.isfinite(v) for v in losses)
    assert all(np.all(np.isfinite(w)) for w in model.get_weights())


def test_a_hundred_bad_batches_in_a_row_leave_scales_bounded_and_clean_data_restores_them(mixed):
    x, y = regression_data()
    model, optimizer = mlp(), keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
    step = training_step(model, optimizer)
    for i in range(0, 256, 32):
        step(x[i : i + 32], y[i : i + 32])
    settled = optimizer.layer_scales()
    before = snapshot(model, optimizer)
    poisoned = np.full_like(x[:32], np.nan)
    for _ in range(100):
        step(poisoned, y[:32])
    assert int(optimizer.skipped_steps.numpy()) == 100
    assert_unchanged(model, optimizer, before)
    for scale in optimizer.layer_scales().values():
        assert math.isfinite(scale) and policies.MIN_SCALE <= scale <= policies.MAX_SCALE
        assert math.frexp(scale)[0] == 0.5

    # A loss that is not finite blames the data, not the scales: no scale backed
    # off, so clean data trains at once at the settled scales.
    assert optimizer.layer_scales() == settled
    recovered_after = None
    for n, i in enumerate(range(256, 512, 32), start=1):
        step(x[i : i + 32], y[i : i + 32])
        now = optimizer.layer_scales()
        if all(abs(math.log2(now[k]) - math.log2(settled[k])) <= 2 for k in settled):
            recovered_after = n
            break
    assert recovered_after == 1, optimizer.layer_scales()
    assert int(optimizer.skipped_steps.numpy()) == 100


def test_all_zero_gradients_apply_cleanly_and_scales_stop_at_the_ceiling(mixed):
    x, y = regression_data(64)
    model = mlp()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))

    @tf.function
    def step(xb):
        with tf.GradientTape() as tape:
            loss = 0.0 * tf.reduce_mean(model(xb, training=True))
            scaled = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)

    trainable = [v.numpy().copy() for v in model.trainable_variables]
    for _ in range(6):
        step(x)
    assert int(optimizer.skipped_steps.numpy()) == 0
    for v, w in zip(model.trainable_variables, trainable, strict=True):
        np.testing.assert_array_equal(v.numpy(), w)
    assert max(optimizer.layer_scales().values()) == policies.MAX_SCALE


def test_frozen_layers_stay_frozen_and_the_rest_trains():
    x, y = regression_data(128)
    model = mlp()
    model.layers[0].trainable = False
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=optimizer, loss="mse")
    frozen = [w.copy() for w in model.layers[0].get_weights()]
    free = [w.copy() for w in model.layers[-1].get_weights()]
    model.fit(x, y, batch_size=32, epochs=2, verbose=0)
    for a, b in zip(model.layers[0].get_weights(), frozen, strict=True):
        np.testing.assert_array_equal(a, b)
    assert any(np.any(a != b) for a, b in zip(model.layers[-1].get_weights(), free, strict=True))
    assert "dense" not in optimizer.layer_scales()  # a frozen layer needs no scale


def test_a_wrapped_branch_that_does_not_reach_the_loss_is_ignored():
    inputs = keras.Input((12,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    used = keras.layers.Dense(3, name="used")(hidden)
    unused = keras.layers.Dense(2, name="unused")(hidden)
    model = keras_als.wrap_model(keras.Model(inputs, [used, unused]))
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    x, y = regression_data(64)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            prediction, _ = model(x, training=True)
            scaled = optimizer.scale_loss(tf.reduce_mean(tf.square(prediction - y)))
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    idle = [w.copy() for w in model.get_layer("unused").get_weights()]
    for _ in range(3):
        step()
    for a, b in zip(model.get_layer("unused").get_weights(), idle, strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(optimizer.iterations.numpy()) == 3


def test_a_model_with_no_wrapped_layer_trains_with_one_loss_scale(mixed):
    x, y = regression_data(256)
    model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(3, dtype="float32")])
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
    model.compile(optimizer=optimizer, loss="mse")
    history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    assert set(optimizer.layer_scales()) == {"loss"}
    assert history.history["loss"][-1] < history.history["loss"][0]


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "bfloat16"])
def test_float32_and_bfloat16_policies_train_without_error(policy):
    keras.config.set_dtype_policy(policy)
    try:
        x, y = regression_data(256)
        model = mlp()
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
        model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
        history = model.fit(x, y, batch_size=32, epochs=3, verbose=0)
    finally:
        keras.config.set_dtype_policy("float32")
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert int(optimizer.skipped_steps.numpy()) == 0
