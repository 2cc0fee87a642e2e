"""A custom training loop compiled with XLA, with layer-wise loss scales.

Trains an MLP on scikit-learn's 8x8 digits (shipped with scikit-learn, no
download) under mixed_float16 in one `tf.function(jit_compile=True)` step:
`optimizer.scale_loss`, `tape.gradient`, then `optimizer.apply`, which unscales
every gradient by its own layer's scale and skips non-finite steps. The step
also reads the true (unscaled) gradient norm with `optimizer.unscale`.

Run: `python examples/custom_loop_xla.py [--epochs N] [--smoke]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads: no C++ INFO lines
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import argparse

import keras
import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

import keras_als

BATCH = 64


def load(seed: int = 0):
    """Shuffled digits as (x, y) train and held-out splits, pixels in [0, 1]."""
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(x))
    x, y = (x[order] / 16.0).astype("float32"), y[order].astype("int32")
    return (x[:1400], y[:1400]), (x[1400:], y[1400:])


def mlp() -> keras.Model:
    """Four Dense layers; the logits stay float32."""
    layers = [keras.Input((64,))]
    layers += [keras.layers.Dense(128, activation="gelu", name=f"dense{i}") for i in range(3)]
    layers += [keras.layers.Dense(10, dtype="float32", name="logits")]
    return keras.Sequential(layers)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="a few steps only (CI)")
    args = parser.parse_args(argv)

    keras.utils.set_random_seed(0)
    (x, y), (x_test, y_test) = load()
    epochs, steps = args.epochs, len(x) // BATCH
    if args.smoke:
        epochs, steps = 1, 8

    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras_als.wrap_model(mlp())
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @tf.function(jit_compile=True)
        def train_step(xb: tf.Tensor, yb: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            with tf.GradientTape() as tape:
                loss = loss_fn(yb, model(xb, training=True))
                scaled = optimizer.scale_loss(loss)  # plans the per-layer scales
            grads = tape.gradient(scaled, model.trainable_variables)
            true_grads = optimizer.unscale(grads, model.trainable_variables)  # to inspect
            optimizer.apply(grads, model.trainable_variables)  # unscales itself; skips NaN/inf
            return loss, tf.linalg.global_norm(true_grads)

        @tf.function(jit_compile=True)
        def predict(xb: tf.Tensor) -> tf.Tensor:
            return tf.argmax(model(xb, training=False), axis=-1, output_type=tf.int32)

        for epoch in range(epochs):
            order = np.random.default_rng(epoch).permutation(len(x))
            losses, norms = [], []
            for i in range(steps):
                batch = order[i * BATCH : (i + 1) * BATCH]
                loss, norm = train_step(tf.constant(x[batch]), tf.constant(y[batch]))
                losses.append(float(loss))
                norms.append(float(norm))
            print(
                f"epoch {epoch + 1}: loss {np.mean(losses):.4f}, "
                f"true gradient norm {np.mean(norms):.4f}, scales {optimizer.layer_scales()}"
            )
        accuracy = float(np.mean(predict(tf.constant(x_test)).numpy() == y_test))
    finally:
        keras.config.set_dtype_policy("float32")

    print(f"\ndigits (scikit-learn, offline): {len(x)} training, {len(x_test)} held-out")
    print(f"final training loss: {losses[-1]:.4f}")
    print(f"held-out accuracy: {accuracy:.4f}")
    print(
        f"steps applied: {int(optimizer.iterations.numpy())}, "
        f"skipped: {int(optimizer.skipped_steps.numpy())}"
    )
    print("per-layer scales:")
    for name, scale in optimizer.layer_scales().items():
        print(f"  {name:8s} 2^{int(np.log2(scale))}")


if __name__ == "__main__":
    main()
