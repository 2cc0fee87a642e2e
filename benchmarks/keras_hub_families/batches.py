"""The data each family trains on: the standard library's docstrings, hashed
into a small vocabulary, and scikit-learn's digits (see the plan in the package
docstring)."""

from __future__ import annotations

import functools
import re
import zlib

import keras
import numpy as np

from benchmarks.harness import hub_tasks

VOCABULARY = 1000
SEQUENCE = 16
IMAGE = 32
CLASSES = 10
TRAIN, HELD_OUT = 160, 32


def _words(text: bytes) -> np.ndarray:
    """`text`'s words, each hashed into the vocabulary (ids 2 and up)."""
    words = re.findall(r"\w+|[^\w\s]", text.decode("utf-8"))
    return np.array([2 + zlib.crc32(w.encode()) % (VOCABULARY - 2) for w in words], np.int32)


@functools.cache
def _corpus(modules: tuple[str, ...]) -> np.ndarray:
    return _words(hub_tasks.standard_library_text(modules))


def _windows(modules, count: int, rng, length: int = SEQUENCE + 1) -> np.ndarray:
    ids = _corpus(modules)
    starts = rng.integers(0, len(ids) - length, count)
    return np.stack([ids[s : s + length] for s in starts])


@functools.cache
def _digits():
    from sklearn import datasets

    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    big = np.repeat(np.repeat(images, 4, axis=1), 4, axis=2)  # 8x8 -> 32x32
    return big, digits.target.astype(np.int32)


def data(kind: str, split: str = "train"):
    """`(x, y)` for family kind `kind`: 160 training or 32 held-out examples."""
    count = TRAIN if split == "train" else HELD_OUT
    rng = np.random.default_rng(0 if split == "train" else 1)
    if kind in ("text", "causal_lm", "seq2seq"):
        half = count // 2
        tokens = np.concatenate(
            [
                _windows(hub_tasks.PRETRAINING_MODULES, half, rng),
                _windows(hub_tasks.FINE_TUNING_MODULES, count - half, rng),
            ]
        )
        labels = np.repeat([0, 1], [half, count - half]).astype(np.int32)
        order = rng.permutation(count)
        tokens, labels = tokens[order], labels[order]
        mask = np.ones((count, SEQUENCE), bool)
        if kind == "text":
            x = {"token_ids": tokens[:, :-1], "padding_mask": mask}
            x["segment_ids"] = np.zeros((count, SEQUENCE), np.int32)
            return x, labels
        if kind == "causal_lm":
            return {"token_ids": tokens[:, :-1], "padding_mask": mask}, tokens[:, 1:]
        x = {
            "encoder_token_ids": tokens[:, :-1],
            "encoder_padding_mask": mask,
            "decoder_token_ids": tokens[:, :-1],
            "decoder_padding_mask": mask,
        }
        return x, tokens[:, 1:]
    images, labels = _digits()
    rows = slice(0, count) if split == "train" else slice(TRAIN, TRAIN + count)
    images, labels = images[rows], labels[rows]
    if kind == "image":
        return np.repeat(images[..., None], 3, -1), labels
    if kind.startswith("segmentation"):
        masks = np.where(images > 0.25, labels[:, None, None] + 1, 0).astype(np.int32)
        if kind.endswith("one_hot"):  # the segmenters' own loss takes one-hot masks
            return np.repeat(images[..., None], 3, -1), np.eye(CLASSES + 1, dtype=np.float32)[masks]
        return np.repeat(images[..., None], 3, -1), masks[..., None]
    if kind == "saliency":
        return np.repeat(images[..., None], 3, -1), (images > 0.25).astype(np.float32)[..., None]
    # Audio: transcribe the digit as the word of its class: [start, class word].
    words = np.stack([np.ones_like(labels), 2 + labels], -1).astype(np.int32)
    if kind == "whisper":
        x = {
            "encoder_features": images,
            "decoder_token_ids": np.concatenate([words, np.zeros((count, 2), np.int32)], -1),
            "decoder_padding_mask": np.array([[1, 1, 0, 0]] * count, np.int32),
        }
        return x, np.concatenate([words[:, 1:], np.zeros((count, 3), np.int32)], -1)
    audio = images.reshape(count, -1, 1)
    x = {
        "encoder_input_values": audio,
        "encoder_padding_mask": np.ones(audio.shape[:2], bool),
        "decoder_token_ids": words,
        "decoder_padding_mask": np.ones((count, 2), bool),
    }
    return x, np.concatenate([words[:, 1:], np.zeros((count, 1), np.int32)], -1)


def inputs_for(model: keras.Model, x):
    """`x` restricted to the inputs `model` takes (a backbone may not take
    `segment_ids` or a padding mask)."""
    if not isinstance(x, dict):
        return x
    names = getattr(model, "input", None)
    if isinstance(names, dict):
        return {k: v for k, v in x.items() if k in names}
    return x
