"""Skipped steps and accuracy of `MaxSafe` at each margin, on the digits CNN.

`python -m benchmarks.profiles margin_sweep [--seeds N] [--margins 1,2,...]`
trains the suite's digits CNN with BatchNormalization (`zoo.digits_cnn`,
mixed_float16, XLA, Adam 3e-3, batch 64, 24 epochs of 19 steps: 456 steps)
under `MaxSafe(margin=m)` for each margin, with the same initial weights and
batches for every margin of a seed, and writes the skipped steps and the
held-out accuracy to `benchmarks/results/margin_sweep.{json,md}`. It is the
measurement behind `MaxSafe`'s default margin of 6 (docs/guide/policies.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_als  # noqa: E402
from benchmarks.harness import provenance, zoo  # noqa: E402
from keras_als import policies  # noqa: E402

EPOCHS, BATCH, LEARNING_RATE = 24, 64, 3e-3
OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "margin_sweep")


def run(margin: int, seed: int, data) -> dict:
    """One training run at `margin`: its skipped steps and held-out accuracy."""
    x, y, x_test, y_test = data
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(seed)
    model = keras_als.wrap_model(zoo.digits_cnn())
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.Adam(LEARNING_RATE), policy=policies.MaxSafe(margin=margin)
    )
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    keras.utils.set_random_seed(seed)  # the same shuffles for every margin
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0)
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    return {
        "margin": margin,
        "seed": seed,
        "steps": int(optimizer.iterations.numpy()) + int(optimizer.skipped_steps.numpy()),
        "skipped": int(optimizer.skipped_steps.numpy()),
        "accuracy": float(accuracy),
    }


def render(saved: dict) -> str:
    """The markdown table of a saved sweep."""
    runs = saved["runs"]
    lines = [
        *provenance.header(
            saved,
            "MaxSafe's margin: skipped steps and accuracy",
            "benchmarks/profiles/margin_sweep.py",
        ),
        f"- Seeds: {saved['seeds']}; {runs[0]['steps']} steps a run",
        "",
        "| margin | skipped steps per run (mean, min-max) | held-out accuracy % (mean) |",
        "| --- | --- | --- |",
    ]
    for margin in saved["margins"]:
        mine = [r for r in runs if r["margin"] == margin]
        skipped = [r["skipped"] for r in mine]
        accuracy = statistics.mean(100 * r["accuracy"] for r in mine)
        lines.append(
            f"| {margin} | {statistics.mean(skipped):.1f} ({min(skipped)}-{max(skipped)}) "
            f"| {accuracy:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    """Trains the digits CNN at every margin and seed; writes the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--margins", default="1,2,3,4,6,8")
    args = parser.parse_args(argv)
    margins = [int(m) for m in args.margins.split(",")]
    data = zoo.digits_data()
    start = time.perf_counter()
    runs = [run(m, seed, data) for seed in range(args.seeds) for m in margins]
    command = "python -m benchmarks.profiles margin_sweep" + (f" {' '.join(argv)}" if argv else "")
    saved = provenance.save(
        OUT,
        command,
        {
            "seconds": time.perf_counter() - start,
            "seeds": list(range(args.seeds)),
            "margins": margins,
            "runs": runs,
        },
        render,
    )
    print(render(saved))
    np.testing.assert_array_less(0, len(runs))


if __name__ == "__main__":
    main()
