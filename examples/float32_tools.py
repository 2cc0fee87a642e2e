"""Layers float16 cannot hold, computed in float32: in `fit` and in a custom loop.

The model's first Dense layer has outputs up to 1e5, beyond float16's largest
value (65504); the LayerNormalization after it brings them back to order one.
Under mixed_float16 its output is inf, the loss NaN, and every step is skipped
at every loss scale. Three runs on the same data:

1. `fit` without the float32 tools: every step skipped, and the warning that says so;
2. `fit` with the `keras_als.Float32Fallback` callback: before the first step it
   diagnoses a batch, computes the layer it names in float32 and calibrates the
   scales; no step is skipped;
3. a custom loop: `keras_als.diagnose`, `diagnosis.apply(model)` and
   `keras_als.calibrate(model, x, y, loss=..., optimizer=...)` before the step is
   first traced (a callback cannot retrace your `tf.function`).

Run: `python examples/float32_tools.py [--epochs N] [--smoke]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads: no C++ INFO lines
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import argparse
import warnings

import keras
import numpy as np
import tensorflow as tf

import keras_als

BATCH = 32


def data(n: int = 512, seed: int = 0):
    """Inputs from a normal distribution; the target is tanh of their sum."""
    x = np.random.default_rng(seed).normal(size=(n, 8)).astype("float32")
    return x, np.tanh(x.sum(axis=1, keepdims=True))


def model() -> keras.Model:
    """Dense (outputs up to 1e5), LayerNormalization, a float32 head; wrapped."""
    keras.utils.set_random_seed(0)
    big = keras.initializers.RandomNormal(stddev=3e4)
    return keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, kernel_initializer=big, name="wide"),
                keras.layers.LayerNormalization(name="norm"),
                keras.layers.Dense(1, dtype="float32", name="head"),
            ]
        )
    )


def fit(x, y, epochs: int, callbacks: list) -> tuple[keras.Model, float]:
    net = model()
    net.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2)), "mse")
    history = net.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0, callbacks=callbacks)
    return net, history.history["loss"][-1]


def custom_loop(x, y, epochs: int) -> tuple[list[str], float, dict]:
    net = model()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
    loss_fn = keras.losses.MeanSquaredError()
    # Before the step is first traced: the layers, float32 for them, then every scale.
    # The model was never compiled, so calibrate is given the loss and the optimizer.
    diagnosis = keras_als.diagnose(net, x[:BATCH], y[:BATCH], loss=loss_fn)
    diagnosis.apply(net)
    keras_als.calibrate(net, x[:BATCH], y[:BATCH], loss=loss_fn, optimizer=optimizer)

    @tf.function(jit_compile=True)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, net(x, training=True))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, net.trainable_variables)
        optimizer.apply(grads, net.trainable_variables)
        return loss

    for _ in range(epochs):
        for i in range(0, len(x), BATCH):
            loss = train_step(x[i : i + BATCH], y[i : i + BATCH])
    return diagnosis.layers, float(loss), optimizer.telemetry()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="2 epochs (a quick check)")
    args = parser.parse_args(argv)
    epochs = 2 if args.smoke else args.epochs
    keras.config.set_dtype_policy("mixed_float16")
    x, y = data()

    print("1. fit, no float32 tools")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", UserWarning)
        net, loss = fit(x, y, epochs, callbacks=[])
    skipped = int(net.optimizer.skipped_steps.numpy())
    print(f"   final loss {loss}, skipped steps: {skipped}")
    for warning in caught:
        if str(warning.message).startswith("keras_als:"):
            print(f"   warning: {str(warning.message)[:96]}...")

    print("2. fit with keras_als.Float32Fallback")
    fallback = keras_als.Float32Fallback(x[:BATCH], y[:BATCH], verbose=False)
    net, loss = fit(x, y, epochs, callbacks=[fallback])
    skipped = int(net.optimizer.skipped_steps.numpy())
    print(f"   set to float32 (step, layers): {fallback.applied}")
    print(f"   final loss {loss:.4f}, skipped steps: {skipped}")

    print("3. custom loop: diagnose, apply, calibrate, then the traced step")
    layers, loss, telemetry = custom_loop(x, y, epochs)
    print(f"   set to float32: {layers}")
    print(f"   final loss {loss:.4f}, skipped steps: {telemetry['skipped_steps']}")
    print(f"   scales: {telemetry['scale']}")


if __name__ == "__main__":
    main()
