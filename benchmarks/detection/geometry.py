"""Boxes: intersection over union, SSD's default boxes, encoding and matching."""

from __future__ import annotations

import functools
import math

import numpy as np

FEATURE_MAPS = ((12, 0.2, 0.35), (6, 0.35, 0.5))
"""(side, s_k, s_k+1) per feature map: SSD's default boxes, scale s_k of the canvas."""
ANCHORS_PER_LOCATION = 4
"""(s_k, s_k), (s', s') with s' = sqrt(s_k s_k+1), and aspect ratios 2 and 1/2."""
VARIANCES = (0.1, 0.2)
"""SSD's encoding variances: centre offsets / 0.1, log size ratios / 0.2."""
MATCH_IOU = 0.5


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of every box in `a` with every box in `b`.

    Args:
        a: `(N, 4)` boxes `(x0, y0, x1, y1)`, continuous coordinates.
        b: `(M, 4)` boxes.

    Returns:
        `(N, M)` IoUs; 0 where the union is empty.
    """
    a = np.asarray(a, np.float64)[:, None, :]
    b = np.asarray(b, np.float64)[None, :, :]
    width = np.clip(np.minimum(a[..., 2], b[..., 2]) - np.maximum(a[..., 0], b[..., 0]), 0, None)
    height = np.clip(np.minimum(a[..., 3], b[..., 3]) - np.maximum(a[..., 1], b[..., 1]), 0, None)
    inter = width * height
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    union = area_a + area_b - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def to_corners(centre: np.ndarray) -> np.ndarray:
    """`(cx, cy, w, h)` -> `(x0, y0, x1, y1)`."""
    c = np.asarray(centre, np.float64)
    half = c[..., 2:] / 2
    return np.concatenate([c[..., :2] - half, c[..., :2] + half], axis=-1)


def to_centre(corners: np.ndarray) -> np.ndarray:
    """`(x0, y0, x1, y1)` -> `(cx, cy, w, h)`."""
    c = np.asarray(corners, np.float64)
    return np.concatenate([(c[..., :2] + c[..., 2:]) / 2, c[..., 2:] - c[..., :2]], axis=-1)


def encode(boxes: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """SSD's offsets of corner `boxes` from centre-form `anchors` (same length).

    `((cx - acx) / (aw v0), (cy - acy) / (ah v0), log(w / aw) / v1, log(h / ah) / v1)`
    with `(v0, v1) = VARIANCES`.
    """
    b = to_centre(boxes)
    a = np.asarray(anchors, np.float64)
    centre = (b[:, :2] - a[:, :2]) / (a[:, 2:] * VARIANCES[0])
    size = np.log(b[:, 2:] / a[:, 2:]) / VARIANCES[1]
    return np.concatenate([centre, size], axis=1)


def decode(offsets: np.ndarray, anchors: np.ndarray) -> np.ndarray:
    """The inverse of `encode`: corner boxes from offsets `(..., A, 4)` and anchors `(A, 4)`."""
    o = np.asarray(offsets, np.float64)
    a = np.asarray(anchors, np.float64)
    centre = a[:, :2] + o[..., :2] * VARIANCES[0] * a[:, 2:]
    size = a[:, 2:] * np.exp(o[..., 2:] * VARIANCES[1])
    return to_corners(np.concatenate([centre, size], axis=-1))


@functools.lru_cache(maxsize=1)
def anchors() -> np.ndarray:
    """Every default box `(cx, cy, w, h)`, in the order of the model's outputs.

    Map by map, row by row, column by column, then the 4 boxes of a location
    (`ANCHORS_PER_LOCATION`): the order of `Reshape((-1, C))` on a
    `(side, side, 4 C)` head output.
    """
    boxes = []
    for side, s, s_next in FEATURE_MAPS:
        between = math.sqrt(s * s_next)
        r = math.sqrt(2.0)
        shapes = ((s, s), (between, between), (s * r, s / r), (s / r, s * r))
        for i in range(side):
            for j in range(side):
                cx, cy = (j + 0.5) / side, (i + 0.5) / side
                boxes += [(cx, cy, w, h) for w, h in shapes]
    return np.array(boxes, np.float64)


def match(
    boxes: np.ndarray, labels: np.ndarray, default_boxes: np.ndarray, threshold: float = MATCH_IOU
) -> np.ndarray:
    """SSD's matching: the training targets of one image.

    Every anchor takes the ground-truth box it overlaps most; it is positive if
    that IoU is >= `threshold`. Then every ground-truth box claims its best
    anchor whatever the IoU (boxes in order: a later box takes an anchor that
    two boxes share as best).

    Args:
        boxes: `(G, 4)` corner boxes, G >= 0.
        labels: `(G,)` digits 0..9.
        default_boxes: `(A, 4)` anchors, centre form.
        threshold: IoU for a positive anchor.

    Returns:
        `(A, 5)` float32: class (0 background, digit + 1) and the 4 encoded offsets
        of the matched box (zeros for background).
    """
    count = len(default_boxes)
    targets = np.zeros((count, 5), np.float32)
    if len(boxes) == 0:
        return targets
    overlaps = iou(to_corners(default_boxes), boxes)
    best_box = overlaps.argmax(axis=1)
    best_iou = overlaps.max(axis=1)
    for g, a in enumerate(overlaps.argmax(axis=0)):
        best_box[a] = g
        best_iou[a] = 2.0  # forced positive
    positive = best_iou >= threshold
    targets[positive, 0] = np.asarray(labels)[best_box[positive]] + 1
    targets[positive, 1:] = encode(np.asarray(boxes)[best_box[positive]], default_boxes[positive])
    return targets
