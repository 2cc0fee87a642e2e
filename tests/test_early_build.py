"""`fit` builds the optimizer inside the traced step; keras_als makes its scale
variables ahead (`keras_als/step/_early_build.py`) so the step is traced once, and the
optimizer and the training are those of one built before `fit`, bit for bit."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als.step import _early_build

X = np.random.RandomState(0).randn(16, 6).astype("float32")
Y = np.random.RandomState(1).randn(16, 1).astype("float32")


@pytest.fixture
def traces(monkeypatch):
    """How many times a step calling `scale_loss` was traced (Python runs it once per trace)."""
    count = {"n": 0}
    scale_loss = keras_als.AdaptiveLossScaleOptimizer.scale_loss

    def counted(self, loss):
        count["n"] += 1
        return scale_loss(self, loss)

    monkeypatch.setattr(keras_als.AdaptiveLossScaleOptimizer, "scale_loss", counted)
    return count


@pytest.fixture(autouse=True)
def _mixed_float16():
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy("float32")


@pytest.fixture
def built_by_apply(monkeypatch):
    """Turns the early build off: `apply` builds the optimizer inside the trace."""

    def off():
        monkeypatch.setattr(_early_build, "variables_to_build_for", lambda state, record: [])

    return off


def _body():
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [keras.Input((6,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(4)],
        name="body",
    )


def _optimizer():
    inner = keras.optimizers.Adam(1e-2, name="inner")  # Adam: slot variables to build
    return keras_als.AdaptiveLossScaleOptimizer(inner, name="als")


def _compiled(model):
    optimizer = _optimizer()
    model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    return model, optimizer


def _state(model, optimizer):
    return (
        [w.numpy() for w in model.weights],
        [(v.path, np.asarray(v.numpy())) for v in optimizer.variables],
    )


def _assert_same(one, other, paths=True):
    weights, variables = one
    other_weights, other_variables = other
    assert len(weights) == len(other_weights)
    for a, b in zip(weights, other_weights):
        np.testing.assert_array_equal(a, b)
    assert len(variables) == len(other_variables)
    if paths:
        assert [path for path, _ in variables] == [path for path, _ in other_variables]
    for (path, a), (_, b) in zip(variables, other_variables):
        np.testing.assert_array_equal(a, b, err_msg=path)


def _head():
    keras.backend.clear_session()  # the same layer names, so the same variable paths
    keras.config.set_dtype_policy("mixed_float16")
    return keras.Sequential([_body(), keras.layers.Dense(1, dtype="float32", name="out")])


def test_fit_traces_the_step_once_and_builds_and_trains_as_apply_would(traces, built_by_apply):
    model, optimizer = _compiled(keras_als.wrap_model(_head()))
    model.fit(X, Y, batch_size=8, epochs=3, verbose=0)
    assert traces["n"] == 1
    assert optimizer.iterations.numpy() + optimizer.skipped_step_count() == 6
    early = _state(model, optimizer)

    built_by_apply()
    model, optimizer = _compiled(keras_als.wrap_model(_head()))
    model.fit(X, Y, batch_size=8, epochs=3, verbose=0)
    assert traces["n"] == 3  # built inside the first trace: traced twice
    _assert_same(early, _state(model, optimizer))


def test_fit_trains_as_with_an_optimizer_built_before_it():
    model, optimizer = _compiled(keras_als.wrap_model(_head()))
    model.fit(X, Y, batch_size=8, epochs=3, verbose=0)
    early = _state(model, optimizer)

    model, optimizer = _compiled(keras_als.wrap_model(_head()))
    optimizer.build(model.trainable_variables)
    model.fit(X, Y, batch_size=8, epochs=3, verbose=0)
    _assert_same(early, _state(model, optimizer), paths=False)  # built outside the name scope


def test_a_wrapped_sub_model_trained_inside_another_model_traces_once(traces):
    body = keras_als.wrap_model(_body())  # the user wraps a backbone, then trains a task on it
    inputs = keras.Input((6,))
    task = keras.Model(inputs, keras.layers.Dense(1, dtype="float32")(body(inputs)))
    task, optimizer = _compiled(task)
    task.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    assert traces["n"] == 1
    assert optimizer.scaling.trainable_variables == tuple(task.trainable_variables)
    assert len(optimizer.layer_scales()) == 3  # the loss and the body's two Dense layers


def _custom_step(model, optimizer, variables):
    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = keras.ops.mean((model(x) - y) ** 2)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, variables)
        optimizer.apply(grads, variables)

    return step


def test_a_step_applying_other_variables_than_the_model_s_is_built_for_them(traces, built_by_apply):
    model = keras_als.wrap_model(_head())
    optimizer = _optimizer()
    last = model.layers[-1].trainable_variables  # fine-tunes the last layer only
    step = _custom_step(model, optimizer, last)
    for _ in range(3):
        step(X, Y)
    assert traces["n"] == 2  # the guess (the whole model) was wrong: traced again
    assert optimizer.scaling.trainable_variables == tuple(last)
    early = _state(model, optimizer)

    built_by_apply()
    model = keras_als.wrap_model(_head())
    optimizer = _optimizer()
    last = model.layers[-1].trainable_variables
    step = _custom_step(model, optimizer, last)
    for _ in range(3):
        step(X, Y)
    _assert_same(early, _state(model, optimizer))  # no guessed variable left among them


def test_an_optimizer_built_by_fit_restores_from_its_checkpoint(tmp_path):
    model, optimizer = _compiled(keras_als.wrap_model(_head()))
    model.fit(X, Y, batch_size=8, epochs=2, verbose=0)
    saved = _state(model, optimizer)
    path = tf.train.Checkpoint(model=model, optimizer=optimizer).write(str(tmp_path / "ckpt"))

    restored_model, restored = _compiled(keras_als.wrap_model(_head()))
    restored.build(restored_model.trainable_variables)
    tf.train.Checkpoint(model=restored_model, optimizer=restored).read(path).assert_consumed()
    _assert_same(saved, _state(restored_model, restored), paths=False)
