"""The training step every method shares, compiled with XLA."""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from benchmarks.harness.scaling import scale_loss


def compiled_step(model: keras.Model, optimizer, loss_fn) -> Callable:
    """The training step both methods share, compiled with XLA."""

    @tf.function(jit_compile=True)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
            scaled = scale_loss(optimizer, loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return train_step
