"""Step time with and without `keras_als.ScaleMonitor`, interleaved in one process.

`python -m benchmarks.profiles monitor_cost [--blocks N]` trains three identical
models (mixed_float16, XLA, a small CNN on digits, batch 64): one plain, one
whose optimizer counts underflow (`estimate_underflow=True`, which the monitor
turns on), and one with a ScaleMonitor (every_n_steps=10). It times alternating
blocks of `fit` (5 epochs of 29 steps each: `fit`'s own start-up, which varies
by tens of milliseconds, is then small beside the steps), prints the median
milliseconds a step of each and their ratios to the plain model's, and writes
them to `benchmarks/results/monitor_cost.{json,md}`.
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
from benchmarks.harness import provenance  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "monitor_cost")


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


ARMS = ("plain", "underflow_counts", "monitor")


def main(argv=None) -> None:
    """Times blocks of `fit` of the three arms, interleaved; prints and saves them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=5, help="epochs of `fit` a block")
    args = parser.parse_args(argv)
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    y = data.target.astype("int32")
    monitor = keras_als.ScaleMonitor(every_n_steps=10)
    models = {arm: model_and_optimizer() for arm in ARMS}
    models["underflow_counts"].optimizer.estimate_underflow = True
    callbacks = {"plain": [], "underflow_counts": [], "monitor": [monitor]}
    steps = -(-len(x) // 64)

    def block(arm):
        start = time.perf_counter()
        models[arm].fit(
            x, y, batch_size=64, epochs=args.epochs, verbose=0, callbacks=callbacks[arm]
        )
        return (time.perf_counter() - start) / (steps * args.epochs) * 1000

    for arm in ARMS:
        block(arm)  # compile and warm up
    ms = {arm: [] for arm in ARMS}
    for _ in range(args.blocks):
        for arm in ARMS:
            ms[arm].append(block(arm))
    np.testing.assert_array_less(0, len(monitor.history["step"]))
    command = "python -m benchmarks.profiles monitor_cost" + (f" {' '.join(argv)}" if argv else "")
    results = {
        "blocks": args.blocks,
        "steps_per_block": steps * args.epochs,
        "ms_per_step": ms,
        "records": len(monitor.history["step"]),
    }
    print(render(provenance.save(OUT, command, results, render)))


def render(saved: dict) -> str:
    """The markdown of a saved measurement."""
    ms = saved["ms_per_step"]
    plain = ms["plain"]
    rows = []
    for arm in ARMS:
        ratios = [a / b for a, b in zip(ms[arm], plain, strict=True)]
        rows.append(
            f"| {arm} | {statistics.median(ms[arm]):.2f} | {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f} .. {max(ratios):.2f}) |"
        )
    return (
        "\n".join(
            [
                *provenance.header(
                    saved,
                    "What `keras_als.ScaleMonitor` costs a step",
                    "benchmarks/profiles/monitor_cost.py",
                ),
                f"- {saved['blocks']} interleaved blocks of {saved['steps_per_block']} steps "
                f"(digits CNN, XLA); the monitor kept {saved['records']} per-layer records",
                "",
                "| arm | ms a step (median) | / plain, same block (median, min .. max) |",
                "| --- | --- | --- |",
                *rows,
            ]
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
