"""The study's models, tiny KerasHub tasks built from their constructors, and its data.

The data: scikit-learn's digits pasted into canvases whose background is
exactly 0 (`benchmarks.detection.canvases` with no noise), so that a patch of
background is a token whose values are all equal, as black backgrounds, zero
padding and letterboxing give.
"""

from __future__ import annotations

import keras
import numpy as np

NUM_CLASSES = 10
"""Digit classes (a segmenter adds the background, class 0)."""


def swin_classifier(embed_dim: int = 24, depths=(1, 1), patch_size: int = 2) -> keras.Model:
    """A Swin classifier on 32x32 images: embed 24, depths [1, 1], heads [2, 4],
    window 4, patch 2 (the study's; the tests also build other sizes)."""
    import keras_hub

    backbone = keras_hub.models.SwinTransformerBackbone(
        image_shape=(32, 32, 3),
        embed_dim=embed_dim,
        depths=list(depths),
        num_heads=[2, 4],
        window_size=4,
        patch_size=patch_size,
        drop_path=0.0,
    )
    return keras_hub.models.SwinTransformerImageClassifier(
        backbone=backbone, num_classes=NUM_CLASSES, preprocessor=None
    )


def segformer_segmenter() -> keras.Model:
    """A SegFormer segmenter on 64x64 images: MiT encoder, depths [1, 1],
    hidden dims [16, 32]."""
    import keras_hub

    encoder = keras_hub.models.MiTBackbone(
        image_shape=(64, 64, 3),
        layerwise_depths=[1, 1],
        num_layers=2,
        layerwise_num_heads=[1, 2],
        layerwise_sr_ratios=[4, 2],
        max_drop_path_rate=0.0,
        hidden_dims=[16, 32],
        layerwise_patch_sizes=[7, 3],
        layerwise_strides=[4, 2],
    )
    backbone = keras_hub.models.SegFormerBackbone(image_encoder=encoder, projection_filters=32)
    return keras_hub.models.SegFormerImageSegmenter(
        backbone=backbone, num_classes=NUM_CLASSES + 1, preprocessor=None
    )


def vit_classifier() -> keras.Model:
    """A ViT classifier on 32x32 images: patch 4, two blocks, width 24."""
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(32, 32, 3),
        patch_size=4,
        num_layers=2,
        num_heads=2,
        hidden_dim=24,
        mlp_dim=48,
    )
    return keras_hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=NUM_CLASSES, preprocessor=None
    )


def _canvases(split: str, digits: tuple[int, int]):
    """The pasted digits of `split` on a background of exact zeros."""
    from benchmarks.detection import canvases

    count = {"train": 2400, "test": 256}[split]
    return canvases.split(split, count, noise=0.0, digits_per_canvas=digits)


def _resized(images: np.ndarray, side: int) -> np.ndarray:
    """Nearest-neighbour resize to `side`, as RGB: a flat region stays exactly flat."""
    index = np.arange(side) * images.shape[1] // side
    return np.repeat(images[:, index][:, :, index], 3, axis=-1).astype(np.float32)


def classification(split: str, side: int = 32):
    """`(images, labels)`: canvases of one digit each at `side` pixels, labelled by it."""
    data = _canvases(split, (1, 1))
    labels = np.array([int(lab[0]) for lab in data.labels], np.int32)
    return _resized(data.images, side), labels


def segmentation(split: str, side: int = 64):
    """`(images, masks)`: each pixel of a digit's box holds its class + 1, else 0,
    one-hot (`(N, side, side, NUM_CLASSES + 1)`), as SegFormer's own loss
    (categorical cross-entropy) takes them."""
    data = _canvases(split, (1, 3))
    masks = np.zeros((len(data.images), side, side, 1), np.int32)
    for i, (boxes, labels) in enumerate(zip(data.boxes, data.labels)):
        for box, label in zip(boxes, labels):
            x0, y0, x1, y1 = (np.asarray(box) * side).round().astype(int)
            masks[i, y0:y1, x0:x1, 0] = int(label) + 1
    one_hot = np.eye(NUM_CLASSES + 1, dtype=np.float32)[masks[..., 0]]
    return _resized(data.images, side), one_hot
