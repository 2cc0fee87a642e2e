"""A small Transformer encoder under mixed_float16 with keras_als.

Task (generated with a fixed numpy seed, no download): each sequence holds 24
tokens from a vocabulary of 8; the label is which of the tokens 1..4 occurs
most often (sequences with a tie are dropped). Token 0 is padding-like noise
and tokens 5..7 are distractors. The encoder (Embedding, MultiHeadAttention,
LayerNormalization, a feed-forward block, residual adds) is wrapped with
`keras_als.wrap_model` and trained with `model.compile` and XLA.

Run: `python examples/transformer_sequence.py [--epochs N] [--smoke]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads: no C++ INFO lines
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import argparse

import keras
import numpy as np

import keras_als

LENGTH, VOCAB, CLASSES = 24, 8, 4


def make_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`n` token sequences and the most frequent of tokens 1..4 in each (0..3)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, VOCAB, size=(3 * n, LENGTH))
    counts = np.stack([(tokens == t).sum(axis=1) for t in range(1, CLASSES + 1)], axis=1)
    top = np.sort(counts, axis=1)
    unique = top[:, -1] > top[:, -2]  # drop ties
    return tokens[unique][:n].astype("int32"), counts[unique][:n].argmax(axis=1).astype("int32")


def encoder(width: int = 32, heads: int = 2) -> keras.Model:
    """One Transformer encoder block (post-norm) and a pooled classifier head."""
    tokens = keras.Input((LENGTH,), dtype="int32", name="tokens")
    h = keras.layers.Embedding(VOCAB, width, name="embed")(tokens)
    attended = keras.layers.MultiHeadAttention(heads, width // heads, name="attention")(h, h)
    h = keras.layers.LayerNormalization(name="norm1")(keras.layers.Add()([h, attended]))
    ff = keras.layers.Dense(2 * width, activation="relu", name="ff1")(h)
    ff = keras.layers.Dense(width, name="ff2")(ff)
    h = keras.layers.LayerNormalization(name="norm2")(keras.layers.Add()([h, ff]))
    pooled = keras.layers.GlobalAveragePooling1D()(h)
    logits = keras.layers.Dense(CLASSES, dtype="float32", name="logits")(pooled)
    return keras.Model(tokens, logits)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="a few steps only (CI)")
    args = parser.parse_args(argv)
    train, epochs = (4000, args.epochs) if not args.smoke else (512, 1)

    keras.utils.set_random_seed(0)
    x, y = make_data(train, seed=0)
    x_test, y_test = make_data(1000, seed=1)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model = keras_als.wrap_model(encoder())
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(2e-3))
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
            jit_compile=True,
        )
        history = model.fit(x, y, batch_size=64, epochs=epochs, verbose=2)
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    finally:
        keras.config.set_dtype_policy("float32")

    majority = np.bincount(y_test, minlength=CLASSES).max() / len(y_test)
    print(f"\nmost frequent of tokens 1..{CLASSES} in {LENGTH} tokens: {len(x)} training sequences")
    print(f"final training loss: {history.history['loss'][-1]:.4f}")
    print(f"held-out accuracy: {accuracy:.4f} (majority class: {majority:.4f})")
    print(
        f"steps applied: {int(optimizer.iterations.numpy())}, "
        f"skipped: {int(optimizer.skipped_steps.numpy())}"
    )
    print("per-layer scales (each residual add has a boundary at each input):")
    for name, scale in optimizer.layer_scales().items():
        print(f"  {name:10s} 2^{int(np.log2(scale))}")


if __name__ == "__main__":
    main()
