"""Held-out mAP: decoding, per-class NMS and VOC all-point average precision, in NumPy."""

from __future__ import annotations

import numpy as np

from benchmarks.detection.canvases import NUM_CLASSES
from benchmarks.detection.geometry import anchors, decode, iou

NMS_IOU = 0.45
SCORE_THRESHOLD = 0.01
TOP_K = 200
"""Candidates per class and image before NMS, as SSD's evaluation."""
KEEP = 100
"""Detections kept per image after NMS."""
EVAL_IOU = 0.5


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float = NMS_IOU) -> np.ndarray:
    """Greedy non-maximum suppression: indices kept, best score first.

    A box is dropped when its IoU with a kept, higher-scoring box is above `threshold`.
    """
    order = np.argsort(-np.asarray(scores), kind="stable")
    overlaps = iou(boxes[order], boxes[order]) > threshold
    suppressed = np.zeros(len(order), bool)
    keep = []
    for n in range(len(order)):
        if not suppressed[n]:
            keep.append(order[n])
            suppressed |= overlaps[n]
    return np.array(keep, np.int64)


def detect(outputs: np.ndarray, default_boxes: np.ndarray | None = None) -> list[tuple]:
    """Detections per image from model outputs `(N, A, C + 4)`.

    Softmax over classes; per image and foreground class: scores above
    `SCORE_THRESHOLD`, the best `TOP_K`, NMS at `NMS_IOU`; then the best `KEEP`
    of the image. Boxes clipped to the canvas.

    Returns:
        Per image `(boxes (D, 4), labels (D,) digits, scores (D,))`.
    """
    default_boxes = anchors() if default_boxes is None else default_boxes
    outputs = np.asarray(outputs, np.float64)
    logits = outputs[..., :-4]
    logits = logits - logits.max(axis=-1, keepdims=True)
    probabilities = np.exp(logits)
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    decoded = np.clip(decode(outputs[..., -4:], default_boxes), 0.0, 1.0)
    found = []
    for boxes, probs in zip(decoded, probabilities):
        kept_boxes, kept_labels, kept_scores = [], [], []
        for c in range(1, probs.shape[1]):
            candidates = np.nonzero(probs[:, c] > SCORE_THRESHOLD)[0]
            candidates = candidates[np.argsort(-probs[candidates, c], kind="stable")[:TOP_K]]
            keep = candidates[nms(boxes[candidates], probs[candidates, c])]
            kept_boxes.append(boxes[keep])
            kept_labels.append(np.full(len(keep), c - 1))
            kept_scores.append(probs[keep, c])
        b, c, s = (np.concatenate(v) for v in (kept_boxes, kept_labels, kept_scores))
        best = np.argsort(-s, kind="stable")[:KEEP]
        found.append((b[best].reshape(-1, 4), c[best], s[best]))
    return found


def average_precision(scores: np.ndarray, true_positive: np.ndarray, ground_truths: int) -> float:
    """VOC's all-point interpolated AP: area under the precision envelope over recall.

    Args:
        scores: Every detection's score.
        true_positive: 1 for a detection matched to a ground truth, else 0.
        ground_truths: Ground-truth objects of the class (> 0).
    """
    order = np.argsort(-np.asarray(scores, np.float64), kind="stable")
    tp = np.asarray(true_positive, np.float64)[order]
    hits, misses = np.cumsum(tp), np.cumsum(1.0 - tp)
    recall = np.concatenate([[0.0], hits / ground_truths, [1.0]])
    precision = np.concatenate([[0.0], hits / np.maximum(hits + misses, 1e-12), [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.nonzero(recall[1:] != recall[:-1])[0]
    return float(np.sum((recall[steps + 1] - recall[steps]) * precision[steps + 1]))


def mean_average_precision(
    detections: list[tuple],
    boxes: list[np.ndarray],
    labels: list[np.ndarray],
    num_classes: int = NUM_CLASSES,
    threshold: float = EVAL_IOU,
) -> tuple[float, list[float]]:
    """VOC mAP at IoU `threshold`: mean AP over the classes with ground truth.

    Per class, detections of all images in decreasing score: each is a true
    positive if its best-overlapping ground-truth box of that class in its
    image has IoU >= `threshold` and was not claimed by a higher-scoring one.

    Args:
        detections: Per image `(boxes, labels, scores)` (`detect`).
        boxes: Per image ground-truth corner boxes.
        labels: Per image ground-truth classes.

    Returns:
        `(mAP, AP per class)`; NaN for a class without ground truth.
    """
    aps = []
    for c in range(num_classes):
        truth = [b[np.asarray(k) == c] for b, k in zip(boxes, labels)]
        count = sum(len(t) for t in truth)
        if count == 0:
            aps.append(float("nan"))
            continue
        found = [
            (score, image, box)
            for image, (b, k, s) in enumerate(detections)
            for box, score in zip(b[k == c], s[k == c])
        ]
        found.sort(key=lambda d: -d[0])  # stable: ties keep image order
        claimed = [np.zeros(len(t), bool) for t in truth]
        hits = np.zeros(len(found))
        for n, (_, image, box) in enumerate(found):
            if len(truth[image]) == 0:
                continue
            overlaps = iou(box[None], truth[image])[0]
            best = int(overlaps.argmax())
            if overlaps[best] >= threshold and not claimed[image][best]:
                claimed[image][best] = True
                hits[n] = 1.0
        aps.append(average_precision([d[0] for d in found], hits, count) if found else 0.0)
    return float(np.nanmean(aps)), aps
