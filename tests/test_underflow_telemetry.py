"""`underflow_rate` tells underflow from true zeros, checked against float32.

Two models whose gradients hold many true zeros: a ReLU net with dead units,
and a per-anchor classifier trained with hard negative mining (the anchors it
leaves out get a zero gradient). On both, float32 and keras_als's mixed
gradients are compared on the same weights and batch: where no value is
non-zero in float32 and zero in float16 (no true underflow), the reported
`underflow_rate` must read (nearly) 0, although the share of exact zeros,
which the telemetry used to report as underflow, is large.
"""

import keras
import numpy as np
import tensorflow as tf

import keras_als
from tests import models

ANCHORS, FEATURES, CLASSES = 32, 8, 4


def dead_relu_model():
    """Two ReLU layers whose negative biases leave most units dead."""
    return keras.Sequential(
        [
            keras.Input((16,)),
            keras.layers.Dense(
                64, activation="relu", bias_initializer=keras.initializers.Constant(-0.5)
            ),
            keras.layers.Dense(
                64, activation="relu", bias_initializer=keras.initializers.Constant(-0.5)
            ),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )


def dead_relu_data(rng):
    x = rng.normal(size=(32, 16)).astype("float32")
    return x, rng.normal(size=(32, 1)).astype("float32")


def dead_relu_loss(y, outputs):
    return tf.reduce_mean(tf.square(outputs - y))


def anchor_model():
    """A per-anchor classifier: features (batch, anchors, features) -> class logits."""
    inputs = keras.Input((ANCHORS, FEATURES))
    hidden = keras.layers.Dense(16, activation="tanh")(inputs)
    logits = keras.layers.Dense(CLASSES)(hidden)
    return keras.Model(inputs, keras.layers.Activation("linear", dtype="float32")(logits))


def anchor_data(rng):
    x = rng.normal(size=(16, ANCHORS, FEATURES)).astype("float32")
    labels = np.zeros((16, ANCHORS), "int32")  # class 0: background
    positives = rng.random((16, ANCHORS)) < 0.05
    labels[positives] = rng.integers(1, CLASSES, positives.sum())
    return x, labels


def mined_loss(labels, logits):
    """Softmax cross-entropy on the positives and on the hardest negatives, three
    per positive (at least one); every other anchor contributes nothing."""
    losses = keras.ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    positive = labels > 0
    negatives = tf.where(positive, tf.zeros_like(losses), losses)
    count = tf.maximum(3 * tf.reduce_sum(tf.cast(positive, tf.int32), axis=1), 1)
    ranked = tf.sort(negatives, axis=1, direction="DESCENDING")
    threshold = tf.gather(ranked, count - 1, batch_dims=1)[:, None]
    hard = tf.logical_and(tf.logical_not(positive), negatives >= threshold)
    kept = tf.logical_or(positive, hard)
    total = tf.reduce_sum(tf.where(kept, losses, tf.zeros_like(losses)))
    return total / tf.maximum(tf.reduce_sum(tf.cast(positive, tf.float32)), 1.0)


CASES = {
    "dead_relu": (dead_relu_model, dead_relu_data, dead_relu_loss),
    "hard_negative_mining": (anchor_model, anchor_data, mined_loss),
}


def _gradients(model, loss_fn, x, y, optimizer=None):
    def loss_of(m):
        return loss_fn(y, m(x, training=True))

    return models.traced_gradients(model, loss_of, optimizer, jit_compile=True)


def _measure(case, policy="max_safe"):
    build, make_data, loss_fn = CASES[case]
    rng = np.random.default_rng(0)
    x, y = make_data(rng)
    keras.utils.set_random_seed(0)
    reference = build()
    weights = reference.get_weights()
    float32_grads = _gradients(reference, loss_fn, x, y)

    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = build()
        model.set_weights(weights)
        model = keras_als.wrap_model(model)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.SGD(0.0), policy=policy, measure_every_n_steps=1
        )
        optimizer.estimate_underflow = True

        @tf.function(jit_compile=True)
        def step():
            with tf.GradientTape() as tape:
                scaled = optimizer.scale_loss(loss_fn(y, model(x, training=True)))
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        for _ in range(4):  # learning rate 0: the weights stay, the scales settle
            step()
        mixed_grads = _gradients(model, loss_fn, x, y, optimizer)
        telemetry = optimizer.telemetry()
    finally:
        keras.config.set_dtype_policy("float32")
    nonzero = sum(int(np.count_nonzero(g)) for g in float32_grads)
    lost = sum(int(np.sum((g32 != 0) & (g16 == 0))) for g32, g16 in zip(float32_grads, mixed_grads))
    return lost / nonzero, telemetry


def test_no_underflow_reads_as_no_underflow_on_a_relu_net_with_dead_units():
    true_underflow, telemetry = _measure("dead_relu")
    assert true_underflow == 0.0
    assert max(telemetry["underflow_rate"].values()) <= 1e-3, telemetry["underflow_rate"]
    # The zeros are there: exact zeros are most of a dead layer's gradients.
    assert max(telemetry["zero_rate"].values()) >= 0.3, telemetry["zero_rate"]


def test_no_underflow_reads_as_no_underflow_under_hard_negative_mining():
    true_underflow, telemetry = _measure("hard_negative_mining")
    assert true_underflow == 0.0
    assert max(telemetry["underflow_rate"].values()) <= 1e-3, telemetry["underflow_rate"]
    assert max(telemetry["zero_rate"].values()) >= 0.3, telemetry["zero_rate"]


def test_real_underflow_reads_as_underflow_where_the_scale_is_far_too_small():
    # The control: at scale 2**-24 everywhere both models' gradients do underflow
    # (against float32), and the figure says so.
    for case in CASES:
        true_underflow, telemetry = _measure(case, keras_als.policies.Fixed(default=2.0**-24))
        assert true_underflow > 0.01, case
        assert max(telemetry["underflow_rate"].values()) > 0.01, (case, telemetry)
