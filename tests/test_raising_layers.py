"""Layers whose float16 call raises: `diagnose` names them, and `Float32Fallback`
computes them in float32 so that the model trains as float32 does.

A layer that combines a float32 constant with its float16 input in a raw
operation raises a dtype mismatch under mixed_float16 and runs in float32;
an error float32 raises too is the model's own, and reaches the caller as it is.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


class AddsFloat32(keras.layers.Layer):
    """Adds a float32 constant to its input: a dtype mismatch in float16.
    With `always`, its call raises in any precision."""

    def __init__(self, always=False, **kwargs):
        super().__init__(**kwargs)
        self.always = always

    def call(self, x):
        if self.always:
            raise ValueError("broken in any precision")
        return x + tf.constant(1.0, tf.float32)

    def compute_output_shape(self, shape):  # so that building does not call it
        return shape


def _model(policy, always=False, middle=None):
    """Dense, then `middle` (by default `AddsFloat32(always)`), then a float32 head."""
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, name="first"),
            middle or AddsFloat32(always, name="adds"),
            keras.layers.Dense(1, name="head", dtype="float32"),
        ]
    )


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(64, 4)).astype("float32"), rng.normal(size=(64, 1)).astype("float32")


def test_a_layer_whose_float16_call_raises_is_named_with_its_error_and_float32_fixes_it():
    x, y = _data()
    model = keras_als.wrap_model(_model("mixed_float16"))
    with pytest.raises(tf.errors.InvalidArgumentError):
        model(x[:8])
    found = keras_als.diagnose(model, x[:8], y[:8], loss=keras.losses.MeanSquaredError())
    [finding] = found.findings
    assert (finding.layer, finding.reason) == ("adds", "raises")
    assert finding.error.startswith("InvalidArgumentError: cannot compute AddV2"), finding.error
    assert "expected to be a half tensor but is a float tensor" in finding.error
    assert "adds: its float16 call raises (in float32 it runs): InvalidArgumentError" in str(found)
    assert model.get_layer("adds").compute_dtype == "float16"  # diagnose changes nothing
    found.apply(model)
    assert model.get_layer("adds").compute_dtype == "float32"
    assert np.isfinite(np.asarray(model(x[:8]))).all()


def test_float32_fallback_trains_a_model_whose_layer_raises_in_float16_as_float32_does():
    """16 steps of Adam 1e-2: the per-epoch losses agree with float32's within
    1e-3 relative (measured 1.1e-4: the first layer still computes in
    float16), and no step is skipped."""
    _assert_the_fallback_trains_as_float32_does(_model, "adds")


def _assert_the_fallback_trains_as_float32_does(build, layer):
    """16 steps of Adam 1e-2 of `build("float32")` and of `build("mixed_float16")`,
    wrapped, with `Float32Fallback`: it moves `layer` before the first step,
    skips none, and the per-epoch losses agree within 1e-3 relative."""
    x, y = _data()
    reference = build("float32")
    reference.compile(keras.optimizers.Adam(1e-2), "mse")
    expected = reference.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
    model = keras_als.wrap_model(build("mixed_float16"))
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
    model.compile(optimizer, "mse")
    fallback = keras_als.Float32Fallback(x[:8], y[:8], verbose=False)
    losses = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False, callbacks=[fallback])
    assert fallback.applied == [(0, [layer])]
    assert int(optimizer.skipped_steps.numpy()) == 0
    np.testing.assert_allclose(losses.history["loss"], expected.history["loss"], rtol=1e-3)


def test_an_error_that_float32_raises_too_is_raised_as_the_model_raises_it():
    x, y = _data()
    model = keras_als.wrap_model(_model("mixed_float16", always=True))
    with pytest.raises(ValueError) as direct:
        model(x[:8], training=True)
    with pytest.raises(ValueError) as diagnosed:
        keras_als.diagnose(model, x[:8], y[:8], loss=keras.losses.MeanSquaredError())
    assert "broken in any precision" in str(diagnosed.value)
    assert str(diagnosed.value) == str(direct.value)
    assert model.get_layer("adds").compute_dtype == "float16"  # policies restored


class AddsPositions(keras.layers.Layer):
    """Adds the positions 0, 1, ... to its input, counted in its compute dtype
    as a rotary position embedding counts them: TensorFlow's `Range` has an
    eager kernel for float16 and none in a graph, so its float16 call runs
    eagerly and raises where `fit` traces it. With `python_bool`, it also
    reads a tensor as a Python bool, which no graph allows, in any precision."""

    def __init__(self, python_bool=False, **kwargs):
        super().__init__(**kwargs)
        self.python_bool = python_bool

    def call(self, x):
        if self.python_bool and bool(tf.reduce_all(x > -1e9)):
            x = x + 0
        return x + tf.range(0, 4, dtype=x.dtype)

    def compute_output_shape(self, shape):
        return shape


def _positions_model(policy, python_bool=False):
    keras.config.set_dtype_policy(policy)  # before the layer takes its policy
    dtype = "float32" if python_bool else None
    return _model(policy, middle=AddsPositions(python_bool, name="positions", dtype=dtype))


def test_a_layer_that_raises_in_float16_only_in_a_graph_is_named_and_float32_trains_it():
    """The float16 call runs eagerly (the eager check alone finds nothing) and
    fails where `fit` traces it; `diagnose` traces the forward pass too, and
    `Float32Fallback` trains the model as float32 does (per-epoch losses within
    1e-3 relative, as the eager case above)."""
    x, y = _data()
    model = keras_als.wrap_model(_positions_model("mixed_float16"))
    assert model(x[:8]).dtype == "float32"  # eagerly it runs
    found = keras_als.diagnose(model, x[:8], y[:8], loss=keras.losses.MeanSquaredError())
    [finding] = found.findings
    assert (finding.layer, finding.reason) == ("positions", "raises")
    assert finding.error.startswith("ValueError: Unsupported dtype19"), finding.error
    _assert_the_fallback_trains_as_float32_does(_positions_model, "positions")


def test_a_layer_that_no_graph_can_trace_in_any_precision_is_not_moved_to_float32():
    """Float32 is no fix for a call that reads a tensor as a Python bool: the
    graph check names nothing, and such a model trains only eagerly."""
    x, y = _data()
    model = keras_als.wrap_model(_positions_model("mixed_float16", python_bool=True))
    with pytest.raises(TypeError):
        tf.function(lambda inputs: model(inputs, training=True), autograph=False)(x[:8])
    found = keras_als.diagnose(model, x[:8], y[:8], loss=keras.losses.MeanSquaredError())
    assert found.layers == []
