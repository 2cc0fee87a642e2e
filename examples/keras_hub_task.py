"""A KerasHub task with layer-wise loss scales: a tiny GPT-2 causal LM.

Builds `keras_hub.models.GPT2CausalLM` from its constructor (a two-block
backbone over bytes, `preprocessor=None`: no download, no tokenizer), wraps it
in place with `keras_als.wrap_model` and trains it to predict the next byte of
this file's own text under mixed_float16 with XLA. The task stays a
GPT2CausalLM: its `compile`, `fit` and `generate` are its own, and every
projection of every transformer block gets its own scale, named by the
shortest unique suffix of its path.

Run: `python examples/keras_hub_task.py [--steps N] [--smoke]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads: no C++ INFO lines
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import argparse

import keras
import keras_hub
import numpy as np

import keras_als

LENGTH, BATCH = 32, 16


def byte_windows(text: bytes, count: int, seed: int = 0):
    """`count` windows of `LENGTH` bytes at random offsets, and each one's next bytes."""
    data = np.frombuffer(text, np.uint8).astype("int32")
    starts = np.random.default_rng(seed).integers(0, len(data) - LENGTH - 1, count)
    tokens = np.stack([data[s : s + LENGTH + 1] for s in starts])
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((count, LENGTH), bool)}
    return x, tokens[:, 1:]


def tiny_gpt2() -> keras_hub.models.GPT2CausalLM:
    keras.utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=256,  # bytes
        num_layers=2,
        num_heads=2,
        hidden_dim=64,
        intermediate_dim=128,
        max_sequence_length=LENGTH,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--smoke", action="store_true", help="30 steps (a quick check)")
    args = parser.parse_args(argv)
    steps = 30 if args.smoke else args.steps
    keras.config.set_dtype_policy("mixed_float16")
    with open(__file__, "rb") as f:
        text = f.read()

    task = keras_als.wrap_model(tiny_gpt2())  # the same object, instrumented in place
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(3e-3))
    task.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    x, y = byte_windows(text, steps * BATCH)
    held_out = byte_windows(text, 4 * BATCH, seed=1)
    before = task.evaluate(*held_out, batch_size=BATCH, verbose=0, return_dict=True)["loss"]
    # The windows are drawn at random already (and the task hands fit a tf.data.Dataset).
    task.fit(x, y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    after = task.evaluate(*held_out, batch_size=BATCH, verbose=0, return_dict=True)["loss"]

    print(f"{type(task).__name__}, {len(task.layers)} layers, {task.count_params():,} weights")
    print(f"held-out loss: {before:.3f} before, {after:.3f} after {steps} steps")
    print(f"skipped: {int(optimizer.skipped_steps.numpy())} of {steps} steps")
    scales = optimizer.layer_scales()
    print(f"{len(scales)} scales, e.g.:")
    for name in [n for n in scales if "transformer_layer_0" in n][:6] + ["loss"]:
        print(f"  {name:52s} 2**{int(np.log2(scales[name]))}")


if __name__ == "__main__":
    main()
