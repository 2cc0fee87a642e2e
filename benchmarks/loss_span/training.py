"""The task, its two-headed model, and one training run with the mechanism's check."""

from __future__ import annotations

import dataclasses
import time

import keras
import numpy as np
import tensorflow as tf

import keras_als
from benchmarks.harness import isolation, scaling

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
