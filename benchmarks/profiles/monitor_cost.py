"""Step time with and without `keras_als.ScaleMonitor`, interleaved in one process.

`python -m benchmarks.profiles monitor_cost [--blocks N]` trains two identical models
(mixed_float16, XLA, digits CNN), one with a ScaleMonitor (every_n_steps=10,
which also turns on the optimizer's zero-share underflow measurement), and
times alternating one-epoch blocks of `fit`. Prints the median ratio.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import keras_als  # noqa: E402


def model_and_optimizer():
    model = keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                keras.layers.Conv2D(16, 3, padding="same", activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.Flatten(),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10, dtype="float32"),
            ]
        )
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model


def main(argv=None) -> None:
    """Times blocks of `fit` with and without a ScaleMonitor, interleaved; prints the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    args = parser.parse_args(argv)
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    plain, watched = model_and_optimizer(), model_and_optimizer()
    monitor = keras_als.ScaleMonitor(every_n_steps=10)

    def block(model, callbacks):
        start = time.perf_counter()
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=callbacks)
        return time.perf_counter() - start

    block(plain, []), block(watched, [monitor])  # compile and warm up
    ratios = []
    for _ in range(args.blocks):
        ratios.append(block(watched, [monitor]) / block(plain, []))
    steps = -(-len(x) // 64)
    print(f"ScaleMonitor cost: {args.blocks} interleaved blocks of {steps} steps (digits CNN, XLA)")
    print("| measure | value |")
    print("| --- | --- |")
    print(f"| step time with / without ScaleMonitor (median) | {statistics.median(ratios):.3f} |")
    print(f"| spread (min .. max) | {min(ratios):.3f} .. {max(ratios):.3f} |")
    print(f"| per-layer records kept | {len(monitor.history['step'])} |")
    np.testing.assert_array_less(0, len(monitor.history["step"]))


if __name__ == "__main__":
    main()
