"""The settings, methods and seeds, and each setting's data and model."""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np

from benchmarks.harness import zoo

METHODS = ("float32", "mixed_no_scaling", "keras_lso", "keras_als")
METHOD_LABELS = {
    "float32": "float32 (reference)",
    "mixed_no_scaling": "mixed_float16, no loss scaling",
    "keras_lso": "mixed_float16 + Keras LossScaleOptimizer",
    "keras_als": "mixed_float16 + keras_als (default policy)",
}
OURS, BASELINE = "keras_als", "keras_lso"
SEEDS = (0, 1, 2, 3, 4)


@dataclasses.dataclass(frozen=True)
class Setting:
    """One heavy-tailed task.

    Attributes:
        name: Short name used in the tables.
        kind: `"mlp"` (teacher regression) or `"cnn"` (digits classification).
        factor: The spiked samples' target multiplier (MLP) or sample weight (CNN).
        rate: Share of the training samples that are spiked.
        epochs: Passes over the training set.
        learning_rate: Adam's learning rate.
        data_seed: Fixes the teacher, the rows and which of them are spiked.
        description: One line for the tables.
        batch: Batch size.
        rows: Training rows (MLP; the CNN uses the 1,200 digits training images).
        layers: Dense(64, sigmoid) layers of the MLP.
        width: Their width.
    """

    name: str
    kind: str
    factor: float
    rate: float
    epochs: int
    learning_rate: float
    data_seed: int
    description: str
    batch: int = 64
    rows: int = 18_000
    layers: int = 10
    width: int = 64

    @property
    def outcome(self) -> str:
        """`"loss"` (held-out MSE, lower is better) or `"accuracy"` (higher is better)."""
        return "loss" if self.kind == "mlp" else "accuracy"


SETTINGS = (
    Setting(
        "mlp_1e4_1pct", "mlp", 1e4, 0.01, 5, 1e-3, 17,
        "teacher regression, 1% of targets x 10^4; 10 x Dense(64, sigmoid) MLP (the reproducer)",
    ),
    Setting(
        "mlp_1e3_1pct", "mlp", 1e3, 0.01, 5, 1e-3, 17,
        "teacher regression, 1% of targets x 10^3; same MLP",
    ),
    Setting(
        "digits_cnn_w1e3", "cnn", 1e3, 0.01, 15, 3e-3, 17,
        "digits CNN (Conv-BN-Conv-Dense), 1% of labels wrong with sample weight 10^3",
    ),
)  # fmt: skip
EXTRA_SETTINGS = (
    Setting(
        "mlp_1e4_0.2pct", "mlp", 1e4, 0.002, 5, 1e-3, 17,
        "teacher regression, 0.2% of targets x 10^4; same MLP",
    ),
)  # fmt: skip
QUICK_SETTINGS = (
    dataclasses.replace(SETTINGS[0], epochs=1),
    dataclasses.replace(SETTINGS[2], epochs=5),
)
QUICK_SEEDS = (0,)


def teacher_mlp_data(setting: Setting) -> tuple[np.ndarray, ...]:
    """`(x, y, x_test, y_test, spiked)` for a teacher regression setting.

    A fixed random teacher, tanh(x W1) w2 with 64 hidden units, on standard
    normal inputs; targets standardized to mean 0 and variance 1 over all rows.
    `spiked` flags the training rows whose target was multiplied by the factor;
    the held-out targets are clean.
    """
    rng = np.random.default_rng(setting.data_seed)
    inputs, hidden, test_rows = 32, 64, 4000
    w1 = rng.normal(size=(inputs, hidden)) / math.sqrt(inputs)
    w2 = rng.normal(size=(hidden, 1)) / math.sqrt(hidden)
    x = rng.normal(size=(setting.rows + test_rows, inputs))
    y = np.tanh(x @ w1) @ w2
    y = (y - y.mean()) / y.std()
    x_train, y_train = x[: setting.rows], y[: setting.rows].copy()
    spiked = np.zeros(setting.rows, bool)
    spiked[rng.choice(setting.rows, size=round(setting.rate * setting.rows), replace=False)] = True
    y_train[spiked] *= setting.factor
    return (
        x_train.astype("float32"),
        y_train.astype("float32"),
        x[setting.rows :].astype("float32"),
        y[setting.rows :].astype("float32"),
        spiked,
    )


def digits_data(setting: Setting) -> tuple[np.ndarray, ...]:
    """`(x, y, x_test, y_test, spiked)` for the digits setting: `spiked` training
    images carry a wrong label (a random other class) and weight `factor`."""
    x, y, x_test, y_test = zoo.digits_data()
    rng = np.random.default_rng(setting.data_seed)
    spiked = np.zeros(len(x), bool)
    spiked[rng.choice(len(x), size=round(setting.rate * len(x)), replace=False)] = True
    y = y.copy()
    y[spiked] = (y[spiked] + rng.integers(1, 10, size=int(spiked.sum()))) % 10
    return x, y, x_test, y_test, spiked


def teacher_mlp(layers: int = 10, width: int = 64) -> keras.Model:
    """`layers` Dense(width, sigmoid) layers and a float32 Dense(1) head, 32 inputs."""
    return keras.Sequential(
        [keras.Input((32,))]
        + [keras.layers.Dense(width, activation="sigmoid") for _ in range(layers)]
        + [keras.layers.Dense(1, dtype="float32")]
    )


KNOWN = {s.name: s for s in SETTINGS + EXTRA_SETTINGS}


def setting_named(name: str) -> Setting:
    return KNOWN[name]
