"""Two losses far apart: where one global loss scale starts to lose, and keras_als does not.

    python -m benchmarks.loss_span          # the plan below, ~20 min on 2 cores (72 runs)
    python -m benchmarks.loss_span --quick  # 1 seed, 3 exponents (checks that it works)

The mechanism (issue 13): when one loss's gradients are far larger than
another's, the largest caps Keras's one dynamic scale, and at that scale the
other loss's gradients fall into float16's subnormal range or flush to zero.
keras_als gives every wrapped layer its own scale, so each branch keeps one
that suits it.

The task, fixed before any number was measured: scikit-learn's 8x8 digits
(1,200 training, 597 held-out images, a fixed permutation), a model with two
heads on the same input, under mixed_float16:

- `value`: Dense(64, relu) and a float32 Dense(1), MSE against a smooth random
  teacher of the pixels times `10**exponent` (the knob: how far the two
  losses' gradients lie apart);
- `digit`: four Dense(64, relu) and float32 logits, sparse categorical
  cross-entropy against the digit's class.

The two branches share no weight, so in float32 the digit branch trains the
same whatever the exponent; its held-out accuracy is the outcome. The loss is
the sum of the two; Adam 1e-3 (per-parameter normalisation keeps the value
branch stable at any target magnitude); batch 64; 16 epochs of 18 batches
(288 steps); `model.fit(jit_compile=True)`; the same initial weights and row
order for every method of a seed. Exponents `EXPONENTS`, seeds `SEEDS`.

Methods: `float32`; `mixed_no_scaling` (mixed_float16, `auto_scale_loss=False`);
`keras_lso` (Keras's `LossScaleOptimizer`, defaults); `keras_als`
(`wrap_model` + `AdaptiveLossScaleOptimizer(Adam)`, defaults).

The mechanism is checked, not assumed: after training, on a fixed batch, each
mixed-precision run computes the digit branch's weight gradients at the scale
its optimizer ended with for that branch (Keras: its one scale; keras_als: the
scale of each layer; no scaling: 1), and counts the share of them that are
exactly zero though they are not at a scale where nothing underflows
(`2**12` on the digit loss alone): `flushed`.

Writes `benchmarks/results/loss_span.json`, `.md` and `.png` (`--quick`: into
`benchmarks/results/quick/`).

Per-loss scales (`--float16-heads`, ~8 min): the same task at `10**12` with
the digit head's last Dense in float16 (the value head's stays float32: its
outputs reach 10^12, beyond float16's range), where that layer's weights share
the scale of the loss unless each output gets its own. Methods
as above plus `keras_als_per_output` (`wrap_model(scale_each_output=True)`);
3 seeds. Writes `loss_span_float16_heads.json` and `.md`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_als  # noqa: E402
from benchmarks.harness import isolation, scaling, stats  # noqa: E402

EXPONENTS = (0, 6, 9, 10, 11, 12)
"""Target magnitudes `10**exponent` of the value loss (fixed before measuring)."""
SEEDS = (0, 1, 2)
EPOCHS = 16
BATCH = 64
TRAIN = 1152  # 18 batches of 64
LEARNING_RATE = 1e-3
METHODS = ("float32", "mixed_no_scaling", "keras_lso", "keras_als")
PER_OUTPUT_METHODS = (*METHODS, "keras_als_per_output")
PER_OUTPUT_EXPONENT = 12
REFERENCE_SCALE = 2.0**12
"""The digit loss alone at this scale underflows nothing (its gradients are < 2**3)."""
BRANCH = ("digit0", "digit1", "digit2", "digit3", "digit")


def data(exponent: float) -> tuple[np.ndarray, ...]:
    """Pixels, digit classes and value targets: train and held-out splits."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.data))
    x = (digits.data[order] / 16.0).astype("float32")
    y = digits.target[order].astype("int32")
    rng = np.random.default_rng(1)
    w1 = rng.normal(size=(64, 16)) / 8.0
    w2 = rng.normal(size=(16, 1)) / 4.0
    value = (np.tanh(x @ w1) @ w2 * 10.0**exponent).astype("float32")
    return x[:TRAIN], y[:TRAIN], value[:TRAIN], x[1200:], y[1200:], value[1200:]


def two_heads(float16_heads: bool = False) -> keras.Model:
    """The value head (1 hidden layer) and the digit head (4), on one input; the
    heads' last Dense in float32, but the digit head's in the global policy if
    `float16_heads` (the value head's outputs, up to 10^12, need float32)."""
    head = {} if float16_heads else {"dtype": "float32"}
    inputs = keras.Input((64,), name="pixels")
    value = keras.layers.Dense(64, activation="relu", name="value_hidden")(inputs)
    value = keras.layers.Dense(1, dtype="float32", name="value")(value)
    digit = inputs
    for i in range(4):
        digit = keras.layers.Dense(64, activation="relu", name=f"digit{i}")(digit)
    digit = keras.layers.Dense(10, name="digit", **head)(digit)
    return keras.Model(inputs, {"value": value, "digit": digit})


@dataclasses.dataclass
class Run:
    exponent: float
    method: str
    seed: int
    accuracy: float
    value_error: float  # held-out MSE / 10**(2 * exponent)
    skipped: int
    flushed: float  # share of the digit branch's weight gradients flushed to zero
    scales: dict  # the digit branch's scale per layer at the end
    seconds: float
    flushed_layers: dict = dataclasses.field(default_factory=dict)  # per layer of it


def _digit_loss(model, x, y):
    logits = tf.cast(model(x, training=False)["digit"], tf.float32)
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))


def flushed_shares(model, x, y, scales: dict) -> dict[str, float]:
    """Per layer of the digit branch, and `"all"`: the share of its weight
    gradients that are zero at `scales` (per layer name) though not at
    `REFERENCE_SCALE`, on one batch."""
    variables = [v for v in model.trainable_variables if _layer(v) in BRANCH]

    def gradients(scale_of):
        # Each layer's weight gradient from the loss at that layer's own scale.
        out = []
        for v in variables:
            with tf.GradientTape() as tape:
                loss = _digit_loss(model, x, y) * scale_of(v)
            out.append(tape.gradient(loss, v).numpy())
        return out

    reference = gradients(lambda v: REFERENCE_SCALE)
    actual = gradients(lambda v: scales.get(_layer(v), 1.0))
    counts = {}
    for v, a, r in zip(variables, actual, reference):
        lost, nonzero = counts.get(_layer(v), (0, 0))
        counts[_layer(v)] = (
            lost + int(np.count_nonzero((a == 0) & (r != 0))),
            nonzero + int(np.count_nonzero(r)),
        )
    shares = {name: lost / max(1, nonzero) for name, (lost, nonzero) in counts.items()}
    total = [sum(c) for c in zip(*counts.values())]
    shares["all"] = total[0] / max(1, total[1])
    return shares


def _layer(variable) -> str:
    parts = variable.path.split("/")
    return parts[-2] if len(parts) >= 2 else parts[0]


def train(
    exponent: float,
    method: str,
    seed: int,
    epochs: int | None = None,
    float16_heads: bool = False,
) -> Run:
    """One training run (`EPOCHS` unless given); returns its outcome and mechanism numbers."""
    epochs = EPOCHS if epochs is None else epochs
    isolation.fresh_session()
    x, y, value, x_test, y_test, value_test = data(exponent)
    keras.config.set_dtype_policy("float32")
    isolation.set_seed(seed)
    weights = two_heads(float16_heads).get_weights()
    order = np.random.default_rng(seed).permutation(len(x))
    x, y, value = x[order], y[order], value[order]
    keras.config.set_dtype_policy("float32" if method == "float32" else "mixed_float16")
    try:
        isolation.set_seed(seed)
        model = two_heads(float16_heads)
        model.set_weights(weights)
        optimizer = keras.optimizers.Adam(LEARNING_RATE)
        if method == "keras_lso":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        elif method.startswith("keras_als"):
            per_output = method == "keras_als_per_output"
            model = keras_als.wrap_model(model, scale_each_output=per_output)
            optimizer = keras_als.AdaptiveLossScaleOptimizer(optimizer)
        model.compile(
            optimizer=optimizer,
            loss={
                "value": keras.losses.MeanSquaredError(),
                "digit": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            },
            metrics={"digit": ["accuracy"]},
            jit_compile=True,
            auto_scale_loss=method != "mixed_no_scaling",
        )
        start = time.perf_counter()
        model.fit(
            x,
            {"value": value, "digit": y},
            batch_size=BATCH,
            epochs=epochs,
            shuffle=False,
            verbose=0,
        )
        seconds = time.perf_counter() - start
        result = model.evaluate(
            x_test, {"value": value_test, "digit": y_test}, verbose=0, return_dict=True
        )
        steps = epochs * (len(x) // BATCH)
        skipped = (
            0
            if method in ("float32", "mixed_no_scaling")
            else scaling.skipped_steps(optimizer, steps)
        )
        if method.startswith("keras_als"):
            scales = {n: s for n, s in optimizer.layer_scales().items() if n in BRANCH}
        elif method == "keras_lso":
            scales = dict.fromkeys(
                BRANCH, float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
            )
        else:
            scales = dict.fromkeys(BRANCH, 1.0)
        shares = (
            {}
            if method == "float32"
            else flushed_shares(model, x_test[:BATCH], y_test[:BATCH], scales)
        )
    finally:
        keras.config.set_dtype_policy("float32")
    return Run(
        exponent,
        method,
        seed,
        float(result["digit_accuracy"]),
        float(result["value_loss"]) / 10.0 ** (2 * exponent),
        skipped,
        shares.get("all", float("nan")),
        scales,
        seconds,
        {k: v for k, v in shares.items() if k != "all"},
    )


def paired(runs: list[Run], exponent: float, method: str, against: str) -> tuple[float, float]:
    """Accuracy of `method` minus `against`, in points, paired by seed: (mean, s.e.)."""
    ours = {r.seed: r.accuracy for r in runs if r.exponent == exponent and r.method == method}
    theirs = {r.seed: r.accuracy for r in runs if r.exponent == exponent and r.method == against}
    return stats.paired_by_seed(ours, theirs, scale=100.0)[:2]


def _mean_sd(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [scale * v for v in values]
    if not values:
        return "-"
    if any(not math.isfinite(v) for v in values):
        return "nan"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def markdown(results: dict, image: str | None) -> str:
    runs = [Run(**r) for r in results["runs"]]
    exponents = sorted({r.exponent for r in runs})
    seeds = sorted({r.seed for r in runs})
    lines = [
        "# Two losses far apart (`benchmarks/loss_span.py`)",
        "",
        f"- Command: `{results['command']}`; {results['date']}; keras_als at {results['commit']}",
        f"- Seeds {seeds}; {EPOCHS} epochs of {TRAIN // BATCH} batches of {BATCH}; Adam "
        f"{LEARNING_RATE:g}; XLA; wall time {results['seconds']:.0f} s",
        "- Outcome: held-out accuracy (%) of the digit head, mean ± sd over seeds. Paired:"
        " keras_als minus Keras LSO, in points, mean ± standard error over seeds.",
        "- flushed: share of the digit branch's weight gradients that flush to zero at the"
        " scale its optimizer ended with (none at 2^12).",
        "",
        "| value targets | float32 | mixed, no scaling | Keras LSO | keras_als "
        "| keras_als − Keras LSO | flushed Keras LSO | flushed keras_als "
        "| Keras LSO scale | keras_als scales, digit0-3 "
        "| skipped Keras LSO / keras_als |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in exponents:
        by = {m: [r for r in runs if r.exponent == e and r.method == m] for m in METHODS}
        mean, error = paired(runs, e, "keras_als", "keras_lso")
        keras_scales = sorted({r.scales["digit"] for r in by["keras_lso"]})
        # The float16 layers of the digit branch (its float32 head computes in float32).
        ours = [s for r in by["keras_als"] for n, s in r.scales.items() if n != "digit"]
        lines.append(
            f"| 10^{e:g} | "
            + " | ".join(_mean_sd([r.accuracy for r in by[m]], 100) for m in METHODS)
            + f" | {mean:+.1f} ± {error:.1f} | "
            + _mean_sd([r.flushed for r in by["keras_lso"]], 100, 1)
            + "% | "
            + _mean_sd([r.flushed for r in by["keras_als"]], 100, 1)
            + "% | "
            + ", ".join(f"2^{math.log2(s):.0f}" for s in keras_scales)
            + f" | 2^{math.log2(min(ours)):.0f}..2^{math.log2(max(ours)):.0f} | "
            + f"{sum(r.skipped for r in by['keras_lso'])} / "
            + f"{sum(r.skipped for r in by['keras_als'])} |"
        )
    if image:
        lines += ["", f"![digit accuracy against the value targets' magnitude]({image})"]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [Run(**r) for r in results["runs"]]
    exponents = sorted({r.exponent for r in runs})
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    labels = {
        "float32": "float32",
        "mixed_no_scaling": "mixed_float16, no scaling",
        "keras_lso": "Keras LossScaleOptimizer",
        "keras_als": "keras_als",
    }
    for method in METHODS:
        means, errors = [], []
        for e in exponents:
            values = [100 * r.accuracy for r in runs if r.exponent == e and r.method == method]
            means.append(statistics.fmean(values))
            errors.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        axis.errorbar(exponents, means, yerr=errors, marker="o", capsize=3, label=labels[method])
    axis.set_xlabel("value targets ~ 10^k: k (the other loss's gradient magnitude)")
    axis.set_ylabel("digit head held-out accuracy (%)")
    axis.set_title("Two losses far apart: one global scale against layer-wise scales")
    axis.legend(loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _commit() -> str:
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "keras_als"], capture_output=True, text=True
        ).stdout.strip()
        return head + (" (keras_als modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def per_output_markdown(runs: list[Run]) -> str:
    """The per-loss-scales table: float16 heads at `10**PER_OUTPUT_EXPONENT`."""
    lines = [
        "# Per-loss scales: float16 heads",
        "",
        "`python -m benchmarks.loss_span --float16-heads`: value targets "
        f"~10^{PER_OUTPUT_EXPONENT}, the digit head's last Dense in float16, seeds "
        f"{sorted({r.seed for r in runs})}, otherwise the loss_span plan. Flushed: share of "
        "the digit branch's weight gradients that are zero at the scales the run ended with "
        "though not at 2^12, each layer at its own scale (it does not follow the chain: "
        "for keras_als with one loss scale the float16 digit layer's gradient flushes "
        "and the layers under it receive nothing, which this share does not show). "
        "Paired: accuracy minus Keras LSO's, points, mean ± s.e.",
        "",
        "| method | digit accuracy (%) | flushed (%) | skipped | digit head's scale "
        "| paired vs Keras LSO |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method in PER_OUTPUT_METHODS:
        mine = [r for r in runs if r.method == method]
        mean, error = paired(runs, PER_OUTPUT_EXPONENT, method, "keras_lso")
        head = sorted({r.scales.get("digit", float("nan")) for r in mine})
        lines.append(
            f"| {method} | {_mean_sd([r.accuracy for r in mine], 100)} "
            f"| {_mean_sd([r.flushed for r in mine], 100)} "
            f"| {_mean_sd([float(r.skipped) for r in mine], 1, 1)} "
            f"| {', '.join(f'{s:.3g}' for s in head)} "
            f"| {'-' if method == 'keras_lso' else f'{mean:+.1f} ± {error:.1f}'} |"
        )
    return "\n".join(lines) + "\n"


def main_per_output(seeds) -> int:
    """The per-loss-scales study (`--float16-heads`)."""
    runs = []
    for seed in seeds:
        for method in PER_OUTPUT_METHODS:
            run = isolation.in_fresh_process(train, PER_OUTPUT_EXPONENT, method, seed, None, True)
            runs.append(run)
            print(
                f"float16 heads seed {seed} {method:21s} accuracy {100 * run.accuracy:5.1f}%"
                f" flushed {100 * run.flushed:5.1f}% skipped {run.skipped}",
                flush=True,
            )
    folder = os.path.join("benchmarks", "results")
    with open(os.path.join(folder, "loss_span_float16_heads.json"), "w") as f:
        json.dump({"commit": _commit(), "runs": [dataclasses.asdict(r) for r in runs]}, f, indent=1)
    text = per_output_markdown(runs)
    with open(os.path.join(folder, "loss_span_float16_heads.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 exponents")
    parser.add_argument(
        "--float16-heads", action="store_true", help="the per-loss-scales study instead"
    )
    args = parser.parse_args(argv)
    if args.float16_heads:
        return main_per_output(SEEDS[:1] if args.quick else SEEDS)
    exponents, seeds = ((0, 9, 12), SEEDS[:1]) if args.quick else (EXPONENTS, SEEDS)
    folder = os.path.join("benchmarks", "results", *(["quick"] if args.quick else []))
    os.makedirs(folder, exist_ok=True)
    start = time.perf_counter()
    runs = []
    for exponent in exponents:
        for seed in seeds:
            for method in METHODS:
                run = isolation.in_fresh_process(train, exponent, method, seed)
                runs.append(run)
                print(
                    f"10^{exponent} seed {seed} {method:17s} accuracy {100 * run.accuracy:5.1f}%"
                    f" flushed {100 * run.flushed:5.1f}% skipped {run.skipped}"
                    f" ({run.seconds:.0f} s)",
                    flush=True,
                )
    results = {
        "command": "python -m benchmarks.loss_span" + (" --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "seconds": time.perf_counter() - start,
        "runs": [dataclasses.asdict(r) for r in runs],
    }
    with open(os.path.join(folder, "loss_span.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.join(folder, "loss_span.png"))
    text = markdown(results, "loss_span.png")
    with open(os.path.join(folder, "loss_span.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
