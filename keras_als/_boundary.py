"""The scale boundary: an identity whose gradient is multiplied by a ratio.

`insert(owner, tensors)` places one boundary on the floating-point tensors a
wrapped layer receives. Forward, it is an identity. Backward, its gradient
function measures the gradient arriving from the layer (largest absolute value,
mean square) and multiplies it by `ratio`, a power of two that the optimizer's
plan sets before backprop starts. The measurement costs one reduction over the
gradient; the plan can make it conditional (`measure_when`), so that steps
which do not refresh the scales skip it. Every boundary made while tracing a graph is
recorded, so that the plan can find the scale components of that graph.

Outside a traced function there is no graph to walk, so `insert` returns the
tensors unchanged.
"""

from __future__ import annotations

import threading
import weakref

import tensorflow as tf


class Boundary:
    """One scale boundary in one traced graph.

    Attributes:
        owner: The `AdaptiveScaled` layer that placed it.
        inputs: Tensors entering the boundary (upstream side).
        outputs: Tensors leaving it (the wrapped layer's side).
        ratio: Scalar float32 multiplier for the gradient, set by the plan; None
            leaves the gradient unchanged.
        gradient_amax: Largest |gradient| that arrived, at the scale of the
            output side (inf if a value was not finite); set during backprop.
        gradient_mean_square: Mean squared gradient that arrived (float32).
        gradient_zeros: (exact zeros, values) in the gradient that arrived.
        measure_when: Scalar bool tensor, set by the plan: measure only when it
            is true (else every statistic reads 0). None: always.
        count_zeros: Whether to measure `gradient_zeros` too (for telemetry).
    """

    def __init__(self, owner, inputs):
        self.owner = owner
        self.inputs = tuple(inputs)
        self.outputs: tuple = ()
        self.ratio: tf.Tensor | None = None
        self.gradient_amax: tf.Tensor | None = None
        self.gradient_mean_square: tf.Tensor | None = None
        self.gradient_zeros: tuple[tf.Tensor, tf.Tensor] | None = None
        self.measure_when: tf.Tensor | None = None
        self.count_zeros = False

    def backward(self, *gradients):
        present = [g for g in gradients if g is not None]
        if present:

            def measure():
                largest = tf.reduce_max(tf.stack([amax(g) for g in present]))
                square = tf.add_n([mean_square(g) for g in present]) / len(present)
                if not self.count_zeros:
                    return largest, square
                counts = [zeros(g) for g in present]
                found = tf.add_n([c[0] for c in counts]), tf.add_n([c[1] for c in counts])
                return largest, square, *found

            measured = _when(self.measure_when, measure, 4 if self.count_zeros else 2)
            self.gradient_amax, self.gradient_mean_square = measured[:2]
            self.gradient_zeros = tuple(measured[2:]) or None
        if self.ratio is None:
            return list(gradients)
        return [None if g is None else multiply(g, self.ratio) for g in gradients]


def _when(condition: tf.Tensor | None, compute, size: int):
    """`compute()`, `size` float32 scalars, where `condition` holds, else zeros."""
    if condition is None:
        return compute()
    return tf.cond(condition, compute, lambda: (tf.constant(0.0),) * size)


def amax(tensor: tf.Tensor) -> tf.Tensor:
    """Largest absolute value of `tensor` as float32; inf if any value is NaN."""
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tensor.values
    magnitude = tf.abs(tensor)
    magnitude = tf.where(
        tf.math.is_nan(magnitude), tf.cast(float("inf"), magnitude.dtype), magnitude
    )
    return tf.cast(tf.reduce_max(magnitude), tf.float32)


def mean_square(tensor: tf.Tensor) -> tf.Tensor:
    """Mean of the squared values of `tensor`, in float32."""
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tensor.values
    return tf.reduce_mean(tf.square(tf.cast(tensor, tf.float32)))


def zeros(tensor: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(number of exact zeros, number of values) in `tensor`, as float32."""
    if isinstance(tensor, tf.IndexedSlices):
        tensor = tensor.values
    count = tf.reduce_sum(tf.cast(tf.equal(tensor, 0), tf.float32))
    return count, tf.cast(tf.size(tensor), tf.float32)


def multiply(gradient: tf.Tensor, ratio: tf.Tensor) -> tf.Tensor:
    """`gradient * ratio`, computed in float32 so that any power of two is exact."""
    if gradient.dtype == tf.float32:
        return gradient * ratio
    return tf.cast(tf.cast(gradient, tf.float32) * ratio, gradient.dtype)


_recorded: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def recorded(graph) -> list[Boundary]:
    """The boundaries made so far while tracing `graph`."""
    with _lock:
        return list(_recorded.get(graph, ()))


def insert(owner, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    """Passes `tensors` through one boundary and records it for the plan.

    Args:
        owner: The layer placing the boundary.
        tensors: Floating-point tensors (at least one).

    Returns:
        Tensors equal to `tensors`, whose gradients cross the boundary.
    """
    if not tensors or not tf.inside_function():
        return list(tensors)
    boundary = Boundary(owner, tensors)

    @tf.custom_gradient
    def identity(*xs):
        return [tf.identity(x) for x in xs], boundary.backward

    outputs = identity(*tensors)
    boundary.outputs = tuple(outputs)
    graph = tf.compat.v1.get_default_graph()
    with _lock:
        _recorded.setdefault(graph, []).append(boundary)
    return list(outputs)
