"""Where branches meet: a join layer keeps a scale per branch, a join written
as an operation makes the branches share one (docs/guide/limitations.md,
"Joins written as operations share scales", and docs/guide/edge_cases.md).
"""

import keras
import numpy as np
import pytest

import keras_als
from keras_als import policies

BATCH = 16


def _two_branches(join):
    """Two Dense branches of one input, joined by `join`, then a Dense head."""
    inputs = keras.Input((8,))
    left = keras.layers.Dense(16, activation="tanh", name="left")(inputs)
    right = keras.layers.Dense(16, activation="tanh", name="right")(inputs)
    joined = {
        "operator": lambda: left + right,
        "keras.ops.add": lambda: keras.ops.add(left, right),
        "Add layer": lambda: keras.layers.Add(name="join")([left, right]),
    }[join]()
    return keras.Model(inputs, keras.layers.Dense(1, name="head")(joined))


def _train(model, policy):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(64, 8)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.05), policy=policy)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return optimizer


# The policy asks for a different scale per branch; each component gets the
# scale of the wrapped layer that holds it, and every other layer in it, the same.
APART = policies.Fixed(default=2.0**5, scales={"left": 2.0**12, "right": 2.0**2})


@pytest.mark.parametrize("join", ["operator", "keras.ops.add"])
def test_branches_joined_by_an_operation_share_one_scale(join):
    model = _two_branches(join)
    plain = keras.models.clone_model(model)
    plain.set_weights(model.get_weights())
    wrapped = keras_als.wrap_model(model)
    scales = _train(wrapped, APART).layer_scales()
    assert scales["left"] == scales["right"] in (2.0**12, 2.0**2), scales
    # ... which the sum needs: the weights are those of scale 1, to the bit.
    unscaled = keras_als.wrap_model(plain)
    _train(unscaled, policies.Fixed(default=1.0))
    for a, e in zip(wrapped.get_weights(), unscaled.get_weights(), strict=True):
        np.testing.assert_array_equal(a, e)


def test_branches_joined_by_a_layer_keep_a_scale_each():
    # The control: the same graph with an `Add` layer gets the two scales asked for.
    optimizer = _train(keras_als.wrap_model(_two_branches("Add layer")), APART)
    scales = optimizer.layer_scales()
    assert (scales["left"], scales["right"]) == (2.0**12, 2.0**2), scales


class _ShapeShared(keras.Model):
    """Two Dense branches with a head each; the right branch is reshaped to
    the runtime shape of the left one, an integer tensor through which no
    gradient flows (as a vision transformer reshapes its tokens to windows)."""

    def __init__(self):
        super().__init__(name="shape_shared")
        self.left = keras.layers.Dense(16, activation="tanh", name="left")
        self.right = keras.layers.Dense(16, activation="tanh", name="right")
        self.head_l = keras.layers.Dense(1, name="head_l")
        self.head_r = keras.layers.Dense(1, name="head_r")

    def call(self, x):
        import tensorflow as tf

        left, right = self.left(x), self.right(x)
        shape = tf.raw_ops.Shape(input=left)  # an op even where the shape is static
        return self.head_l(left) + self.head_r(tf.reshape(right, shape))


def test_branches_that_share_only_a_shape_keep_a_scale_each():
    # Joining components through such a tensor held a whole Swin backbone at
    # one scale, the one its first stage needed.
    keras.utils.set_random_seed(0)
    model, plain = _ShapeShared(), _ShapeShared()
    model(np.zeros((1, 8), "float32"))
    plain(np.zeros((1, 8), "float32"))
    plain.set_weights(model.get_weights())
    scales = _train(keras_als.wrap_model(model), APART).layer_scales()
    assert (scales["left"], scales["right"]) == (2.0**12, 2.0**2), scales
    # The scales apart change no weight: those of scale 1, to the bit.
    _train(keras_als.wrap_model(plain), policies.Fixed(default=1.0))
    for a, e in zip(model.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_array_equal(a, e)
