"""The SSD-like model and its multibox loss."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers, ops

from benchmarks.detection.canvases import CANVAS, NUM_CLASSES
from benchmarks.detection.geometry import ANCHORS_PER_LOCATION

NEG_POS_RATIO = 3
WIDTHS = (8, 16, 32, 64)
"""Filters of the convolution blocks at 48, 24, 12 and 6 pixels."""


@keras.saving.register_keras_serializable(package="keras_als_benchmarks")
class L2Normalization(layers.Layer):
    """SSD's L2Norm: each location's channel vector scaled to unit length, times a
    learned per-channel scale (initialised at 20, as SSD's conv4_3).

    The norm is computed in float32 (as Keras's own normalisation layers do under
    mixed_float16): in float16 the epsilon is zero, and a location whose channels
    are all zero (dead ReLUs) would give 0/0.
    """

    def __init__(self, initial_scale: float = 20.0, epsilon: float = 1e-10, **kwargs):
        super().__init__(**kwargs)
        self.initial_scale = initial_scale
        self.epsilon = epsilon

    def build(self, input_shape):
        self.scale = self.add_weight(
            shape=(input_shape[-1],),
            initializer=keras.initializers.Constant(self.initial_scale),
            name="scale",
        )

    def call(self, x):
        x = ops.cast(x, "float32")
        norm = ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True) + self.epsilon)
        return ops.cast(x / norm * ops.cast(self.scale, "float32"), self.compute_dtype)

    def get_config(self):
        return {
            **super().get_config(),
            "initial_scale": self.initial_scale,
            "epsilon": self.epsilon,
        }


def ssd_model() -> keras.Model:
    """The SSD-like detector, under the current dtype policy; output `(batch, 720, 15)`
    float32: 11 class logits (background first), then 4 box offsets per anchor."""
    inputs = keras.Input((CANVAS, CANVAS, 1))

    def conv(h, filters):
        return layers.Conv2D(filters, 3, padding="same", activation="relu")(h)

    h = conv(inputs, WIDTHS[0])
    h = layers.MaxPooling2D()(h)  # 24
    h = conv(conv(h, WIDTHS[1]), WIDTHS[1])
    h = layers.MaxPooling2D()(h)  # 12
    h = conv(conv(h, WIDTHS[2]), WIDTHS[2])
    early = L2Normalization(20.0, name="l2norm")(h)  # SSD's conv4_3 + L2Norm
    h = layers.MaxPooling2D()(h)  # 6
    late = conv(conv(h, WIDTHS[3]), WIDTHS[3])  # SSD's fc7
    classes, offsets = [], []
    for feature in (early, late):
        c = layers.Conv2D(ANCHORS_PER_LOCATION * (NUM_CLASSES + 1), 3, padding="same")(feature)
        o = layers.Conv2D(ANCHORS_PER_LOCATION * 4, 3, padding="same")(feature)
        classes.append(layers.Reshape((-1, NUM_CLASSES + 1))(c))
        offsets.append(layers.Reshape((-1, 4))(o))
    outputs = layers.Concatenate(axis=-1)(
        [layers.Concatenate(axis=1)(classes), layers.Concatenate(axis=1)(offsets)]
    )
    outputs = layers.Activation("linear", dtype="float32", name="to_float32")(outputs)
    return keras.Model(inputs, outputs, name="ssd_digits")


def smooth_l1(x):
    """`0.5 x^2` where `|x| < 1`, else `|x| - 0.5` (SSD's, beta 1)."""
    a = tf.abs(x)
    return tf.where(a < 1.0, 0.5 * tf.square(x), a - 0.5)


def hard_negatives(labels, cross_entropy, neg_pos_ratio: int = NEG_POS_RATIO):
    """SSD's hard negative mining: which background anchors the loss keeps.

    In each image, the background anchors are ranked by their cross-entropy
    (largest first, equal values by anchor index) and the first
    `min(neg_pos_ratio * positives, background anchors)` are kept.

    Args:
        labels: `(B, A)` int classes, 0 for background.
        cross_entropy: `(B, A)` each anchor's cross-entropy (>= 0).
        neg_pos_ratio: Negatives kept per positive.

    Returns:
        `(B, A)` bool, true for the mined background anchors.
    """
    positive = labels > 0
    positives = tf.reduce_sum(tf.cast(positive, tf.int32), axis=1, keepdims=True)
    anchors_per_image = tf.shape(labels)[1]
    negatives = tf.minimum(neg_pos_ratio * positives, anchors_per_image - positives)
    # Cross-entropy >= 0, so -1 ranks every positive after every background anchor.
    ranking = tf.stop_gradient(tf.where(positive, -1.0, tf.cast(cross_entropy, tf.float32)))
    # top_k puts equal values in index order; scattering positions gives each anchor's
    # rank (one sort: a second argsort costs as much again under XLA on the CPU).
    _, order = tf.math.top_k(ranking, k=anchors_per_image)
    rows = tf.broadcast_to(tf.range(tf.shape(labels)[0])[:, None], tf.shape(order))
    positions = tf.broadcast_to(tf.range(anchors_per_image)[None, :], tf.shape(order))
    rank = tf.scatter_nd(tf.stack([rows, order], axis=-1), positions, tf.shape(order))
    return tf.logical_and(tf.logical_not(positive), rank < negatives)


def multibox_loss(y_true, y_pred, neg_pos_ratio: int = NEG_POS_RATIO):
    """SSD's multibox loss for a batch.

    Args:
        y_true: `(B, A, 5)`: class (0 background) and encoded offsets (`match`).
        y_pred: `(B, A, C + 4)` float32: C class logits, then 4 offsets.
        neg_pos_ratio: Negatives kept per positive, per image (`hard_negatives`).

    Returns:
        `(sum of cross-entropy over positives and mined negatives + sum of smooth
        L1 over the positives' offsets) / max(positives in the batch, 1)`.
    """
    y_true = tf.cast(y_true, tf.float32)
    y_pred = tf.cast(y_pred, tf.float32)
    labels = tf.cast(y_true[..., 0], tf.int32)
    logits, offsets = y_pred[..., :-4], y_pred[..., -4:]
    positive = labels > 0
    positive_f = tf.cast(positive, tf.float32)
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    kept = tf.logical_or(positive, hard_negatives(labels, cross_entropy, neg_pos_ratio))
    confidence = tf.reduce_sum(tf.where(kept, cross_entropy, 0.0))
    location = tf.reduce_sum(smooth_l1(offsets - y_true[..., 1:]) * positive_f[..., None])
    return (confidence + location) / tf.maximum(tf.reduce_sum(positive_f), 1.0)
