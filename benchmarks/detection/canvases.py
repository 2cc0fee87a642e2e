"""The data: scikit-learn's digits pasted into canvases, with their boxes and labels."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from benchmarks.detection.geometry import anchors, iou, match

CANVAS = 48
"""Canvas side in pixels."""
DIGIT_SIZES = (8, 20)
"""Each pasted digit's width and height, drawn independently (inclusive)."""
DIGITS_PER_CANVAS = (1, 3)
"""Digits per canvas, inclusive."""
INK = 0.25
"""A resized digit's pixels above this (of 1.0) are ink; its box is the ink's."""
NUM_CLASSES = 10
"""Digit classes; targets and outputs add a background class 0 (digit d is class d + 1)."""
DIGIT_POOLS = {"train": (0, 1000), "validation": (1000, 1200), "test": (1200, 1797)}
"""Which of load_digits' 1,797 images each split pastes: disjoint ranges."""
CANVASES = {"train": 3000, "validation": 300, "test": 400}
"""Canvases per split."""
DATA_SEEDS = {"train": 0, "validation": 1, "test": 2}
"""The data is the same for every run seed; run seeds vary weights and batch order."""


def resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Bilinear resize of a 2-D image (half-pixel centres, edges clamped)."""
    h0, w0 = image.shape

    def grid(n_out, n_in):
        x = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        lo = np.floor(x).astype(int)
        return lo, np.minimum(lo + 1, n_in - 1), x - lo

    y0, y1, wy = grid(height, h0)
    x0, x1, wx = grid(width, w0)
    top = image[y0][:, x0] * (1 - wx) + image[y0][:, x1] * wx
    bottom = image[y1][:, x0] * (1 - wx) + image[y1][:, x1] * wx
    return top * (1 - wy)[:, None] + bottom * wy[:, None]


@dataclasses.dataclass
class Split:
    """Canvases with their ground truth and training targets.

    Attributes:
        images: `(N, CANVAS, CANVAS, 1)` float32 in [0, 1].
        boxes: Per canvas, `(G, 4)` corner boxes in [0, 1].
        labels: Per canvas, `(G,)` digits.
        targets: `(N, A, 5)` float32, `match` of every canvas.
    """

    images: np.ndarray
    boxes: list[np.ndarray]
    labels: list[np.ndarray]
    targets: np.ndarray


def make_split(
    digits: np.ndarray,
    digit_labels: np.ndarray,
    count: int,
    seed: int,
    noise: float = 0.1,
    digits_per_canvas: tuple[int, int] = DIGITS_PER_CANVAS,
) -> Split:
    """`count` canvases pasting `digits` (`(n, 8, 8)` in [0, 1]) with a fixed seed.

    Each canvas: uniform noise in [0, `noise`] (0: a background exactly 0), then
    `digits_per_canvas` (inclusive, 1-3 by default) digits, each resized to a
    width and height drawn from `DIGIT_SIZES`, at a random place whose paste
    rectangle overlaps no earlier one by more than IoU 0.1 (up to 20 tries, else
    the digit is left out), blended by maximum.
    """
    rng = np.random.default_rng(seed)
    images = np.zeros((count, CANVAS, CANVAS, 1), np.float32)
    all_boxes, all_labels = [], []
    lo, hi = DIGIT_SIZES
    for n in range(count):
        canvas = rng.uniform(0.0, noise, size=(CANVAS, CANVAS))
        pasted, boxes, labels = [], [], []
        for _ in range(rng.integers(digits_per_canvas[0], digits_per_canvas[1] + 1)):
            k = rng.integers(len(digits))
            h, w = rng.integers(lo, hi + 1, size=2)
            for _ in range(20):
                y, x = rng.integers(0, CANVAS - h + 1), rng.integers(0, CANVAS - w + 1)
                rect = np.array([[x, y, x + w, y + h]], np.float64)
                if not pasted or iou(rect, np.array(pasted)).max() <= 0.1:
                    break
            else:
                continue
            patch = resize(digits[k], h, w)
            canvas[y : y + h, x : x + w] = np.maximum(canvas[y : y + h, x : x + w], patch)
            rows, cols = np.nonzero(patch > INK)
            pasted.append(rect[0])
            boxes.append([x + cols.min(), y + rows.min(), x + cols.max() + 1, y + rows.max() + 1])
            labels.append(digit_labels[k])
        images[n, ..., 0] = canvas
        all_boxes.append(np.array(boxes, np.float64).reshape(-1, 4) / CANVAS)
        all_labels.append(np.array(labels, np.int64))
    default = anchors()
    targets = np.stack([match(b, c, default) for b, c in zip(all_boxes, all_labels)])
    return Split(images, all_boxes, all_labels, targets)


@functools.cache
def split(
    name: str,
    count: int | None = None,
    noise: float = 0.1,
    digits_per_canvas: tuple[int, int] = DIGITS_PER_CANVAS,
) -> Split:
    """The split `name` ("train", "validation" or "test"), made once per process
    and arguments: `count` canvases (`CANVASES[name]` by default), the others
    as `make_split` takes them."""
    from sklearn.datasets import load_digits

    data = load_digits()
    start, stop = DIGIT_POOLS[name]
    digits = (data.images[start:stop] / 16.0).astype(np.float64)
    count = CANVASES[name] if count is None else count
    return make_split(
        digits, data.target[start:stop], count, DATA_SEEDS[name], noise, digits_per_canvas
    )
