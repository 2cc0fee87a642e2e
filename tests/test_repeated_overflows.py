"""A layer where overflows start again and again moves to float32.

`Spiky` is a residual layer whose backward pass, inside its call, holds a
gradient 1e6 times its output's on the batches that carry a marked example,
and shrinks it back by 1e-6 before its input and weight: what a LayerNorm
over near-constant inputs does to its gradients. Its own gradients stay
ordinary, so `diagnose` names nothing on any batch, but in float16 the
intermediate overflows at every scale that holds the ordinary batches, and
the step is skipped. `Float32Fallback` moves it once overflows started there
on `repeated_overflows` steps, and no step is skipped after.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als

EVERY = 4  # one batch in EVERY carries a marked example


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


class Spiky(keras.layers.Layer):
    def build(self, shape):
        self.k = self.add_weight(shape=(shape[-1],), initializer="ones", name="k")

    def call(self, x):
        marked = tf.cast(x[:, :1] > 5.0, x.dtype)  # the marked examples
        thousand = 1 + marked * tf.cast(999, x.dtype)  # 1e6 in two factors: float16 holds 1e3

        @tf.custom_gradient
        def shrink(a):  # forward identity; backward 1e-6
            return tf.identity(a), lambda g: g * tf.cast(1e-3, g.dtype) * tf.cast(1e-3, g.dtype)

        @tf.custom_gradient
        def amplify(c):  # forward identity; backward 1e6 on the marked examples
            return tf.identity(c), lambda g: g * thousand * thousand

        return x + amplify(shrink(x * self.k)) * tf.cast(1e-3, x.dtype)


def _model():
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    return keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((8,)),
                Spiky(name="spiky"),
                keras.layers.Dense(8, name="dense"),
                keras.layers.Dense(1, name="head", dtype="float32"),
            ]
        )
    )


def _data(batches=40, batch=4):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(batches * batch, 8)).astype("float32")
    x[:, 0] = np.clip(x[:, 0], -3, 3)
    x[EVERY * batch + 1 :: EVERY * batch, 0] = 10.0  # marked, from batch EVERY + 1 on
    return x, rng.normal(size=(batches * batch, 1)).astype("float32")


def _fit(repeated_overflows):
    x, y = _data()
    model = _model()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(1e-3))
    model.compile(optimizer, "mse")
    fallback = keras_als.Float32Fallback(
        x[:16], y[:16], repeated_overflows=repeated_overflows, verbose=False
    )
    model.fit(x, y, batch_size=4, epochs=1, verbose=0, shuffle=False, callbacks=[fallback])
    return model, optimizer, fallback


def test_the_layer_where_overflows_start_on_three_steps_moves_and_no_step_is_skipped_after():
    x, y = _data()
    found = keras_als.diagnose(_model(), x[:16], y[:16], loss=keras.losses.MeanSquaredError())
    assert found.layers == []  # one batch shows nothing
    model, optimizer, fallback = _fit(repeated_overflows=3)
    [(step, layers)] = fallback.applied
    assert layers == ["spiky"]
    assert step == 3 * EVERY + 1  # after its third marked batch (steps 4, 8, 12)
    assert int(optimizer.skipped_steps.numpy()) == 3
    assert model.get_layer("spiky").compute_dtype == "float32"
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_without_the_move_every_marked_batch_is_skipped():
    """The reference the test above is read against: the same run, the rule
    set beyond reach, skips each of the 9 marked batches."""
    model, optimizer, fallback = _fit(repeated_overflows=100)
    assert fallback.applied == []
    assert int(optimizer.skipped_steps.numpy()) == 9


def test_repeated_overflows_below_one_is_an_error_that_names_the_argument():
    with pytest.raises(ValueError, match="repeated_overflows"):
        keras_als.Float32Fallback(np.ones((1, 1)), np.ones((1, 1)), repeated_overflows=0)
