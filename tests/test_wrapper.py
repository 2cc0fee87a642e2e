"""AdaptiveScaled: one layer given its own scale by hand; same function, no surprises."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import keras_als


def _single_layer_model(kind):
    rng = np.random.default_rng(3)
    if kind == "Embedding":
        inputs = keras.Input((6,), dtype="int32")
        x = rng.integers(0, 20, size=(4, 6)).astype("int32")
        return keras.Model(inputs, layers.Embedding(20, 5)(inputs)), x
    shapes = {"Conv1D": (10, 3), "Conv2D": (6, 6, 3), "MultiHeadAttention": (5, 8)}
    inputs = keras.Input(shapes.get(kind, (7,)))
    make = {
        "Dense": lambda: layers.Dense(4),
        "Conv1D": lambda: layers.Conv1D(4, 3),
        "Conv2D": lambda: layers.Conv2D(4, 3),
        "BatchNormalization": lambda: layers.BatchNormalization(),
        "LayerNormalization": lambda: layers.LayerNormalization(),
    }
    if kind == "MultiHeadAttention":
        outputs = layers.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    else:
        outputs = make[kind]()(inputs)
    x = rng.normal(size=(4, *shapes.get(kind, (7,)))).astype("float32")
    return keras.Model(inputs, outputs), x


LAYER_KINDS = [
    "Dense",
    "Conv1D",
    "Conv2D",
    "BatchNormalization",
    "LayerNormalization",
    "Embedding",
    "MultiHeadAttention",
]


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_a_wrapped_layer_computes_the_same_outputs_and_traced_gradients(kind):
    model, x = _single_layer_model(kind)
    inputs = keras.Input(x.shape[1:], dtype=str(x.dtype))
    layer = model.layers[-1]
    wrapped = keras.Model(inputs, keras_als.AdaptiveScaled(layer)(*_call_args(kind, inputs)))
    np.testing.assert_array_equal(wrapped(x, training=False), model(x, training=False))

    @tf.function
    def gradients(m):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(m(x, training=True)))
        return tape.gradient(loss, m.trainable_variables)

    for a, b in zip(gradients(wrapped), gradients(model), strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), rtol=1e-6)


def _call_args(kind, inputs):
    return (inputs, inputs) if kind == "MultiHeadAttention" else (inputs,)


def test_subclassed_model_with_wrapped_layers_trains_with_layer_wise_scales():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras_als.AdaptiveScaled(layers.Dense(8, activation="sigmoid"))
            self.out = keras_als.AdaptiveScaled(layers.Dense(1))

        def call(self, x):
            return self.out(self.hidden(x))

    model = Subclassed()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(32, 4)), rng.normal(size=(32, 1)), epochs=2, verbose=0)
    assert set(optimizer.layer_scales()) == {"loss", "dense", "dense_1"}


def test_adaptive_scaled_config_round_trip():
    wrapper = keras_als.AdaptiveScaled(layers.Dense(3, activation="relu", name="hidden"))
    wrapper.build((None, 4))
    config = wrapper.get_config()
    restored = keras_als.AdaptiveScaled.from_config(config)
    assert restored.get_config() == config
    assert restored.name == "hidden_scaled" and restored.layer.name == "hidden"
    serialized = keras.saving.serialize_keras_object(wrapper)
    assert type(keras.saving.deserialize_keras_object(serialized)) is keras_als.AdaptiveScaled


def test_wrapper_keeps_the_layer_dtype_policy():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        head = layers.Dense(2, dtype="float32")
        wrapper = keras_als.AdaptiveScaled(head)
        assert wrapper.dtype_policy.name == "float32"
        assert keras_als.AdaptiveScaled(layers.Dense(2)).compute_dtype == "float16"
    finally:
        keras.config.set_dtype_policy("float32")


def test_wrapping_a_wrapper_or_a_non_layer_is_refused():
    wrapper = keras_als.AdaptiveScaled(layers.Dense(2, name="dense"))
    with pytest.raises(ValueError, match="already wrapped"):
        keras_als.AdaptiveScaled(wrapper)
    with pytest.raises(TypeError, match="keras.layers.Layer"):
        keras_als.AdaptiveScaled("dense")
