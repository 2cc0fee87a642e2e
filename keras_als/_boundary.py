"""The scale boundary: an identity whose gradient is multiplied by a ratio.

`insert(owner, tensors)` places one boundary on floating-point tensors a
scaled layer receives (`_layer_call` places one per input, since inputs
from different regions need different ratios). Forward, it is an identity. Backward, its gradient
function hands the gradient arriving from the layer to the plan's `crossings`
(which reduce it for the statistics on the steps that measure; a large one
then waits for its reductions, through an exact zero added to the ratio) and multiplies
it by `ratio`, a power of two that the optimizer's plan sets before backprop
starts. Every boundary made while tracing a graph goes into the step's record
(`_step_record`), so that the plan can find the scale components of that graph.

Outside a traced function there is no graph to walk, so `insert` returns the
tensors unchanged.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from keras_als import _step_record


class Boundary:
    """One scale boundary in one traced graph.

    Attributes:
        owner: What placed it, an `AdaptiveScaled` or a layer's `wrap_model`
            hook (held weakly: the traced graph, which keeps the boundary,
            must not keep the layer).
        inputs: Tensors entering the boundary (upstream side).
        limit: The largest finite value of the upstream gradient's dtype (its
            gradient is cast back to the dtype of `upstream` in `insert`).
        outputs: Tensors leaving it (the wrapped layer's side).
        ratio: Scalar float32 multiplier for the gradient, handed over by the
            plan (`connect`); None leaves the gradient unchanged.
        crossings: The plan's `_crossings.Crossings`, which take the gradient
            arriving from the wrapped layer's side (at the scale of that side),
            before the multiply; None: nobody measures it.
    """

    def __init__(self, owner, inputs, limit):
        self._owner = weakref.ref(owner)
        self.inputs = tuple(inputs)
        self.limit = limit
        self.outputs: tuple = ()
        self.ratio: tf.Tensor | None = None
        self.crossings = None

    @property
    def owner(self):
        return self._owner()

    def connect(self, ratio: tf.Tensor | None, crossings) -> None:
        """Takes the plan's ratio and crossings for the backward pass."""
        self.ratio = ratio
        self.crossings = crossings

    def backward(self, *gradients):
        ratio = self.ratio
        if self.crossings is not None:
            zero = self.crossings.arrived(self, [g for g in gradients if g is not None])
            if zero is not None:  # the gradients wait for their reductions (`_crossings`)
                ratio = zero + (1.0 if ratio is None else ratio)
        if ratio is None:
            return list(gradients)
        return [None if g is None else multiply(g, ratio) for g in gradients]


def multiply(gradient: tf.Tensor, ratio: tf.Tensor) -> tf.Tensor:
    """`gradient * ratio`, computed in float32 so that any power of two is exact."""
    if gradient.dtype == tf.float32:
        return gradient * ratio
    return tf.cast(tf.cast(gradient, tf.float32) * ratio, gradient.dtype)


def insert(owner, tensors: list[tf.Tensor], upstream: list[tf.Tensor] | None = None):
    """Passes `tensors` through one boundary and records it for the plan.

    Args:
        owner: The layer placing the boundary.
        tensors: Floating-point tensors (at least one).
        upstream: The tensors `tensors` were cast from, if any: the gradient
            upstream of the boundary takes their dtypes.

    Returns:
        Tensors equal to `tensors`, whose gradients cross the boundary.
    """
    if not tensors or not tf.inside_function():
        return list(tensors)
    limit = min(t.dtype.max for t in (upstream or tensors))
    boundary = Boundary(owner, tensors, limit)

    @tf.custom_gradient
    def identity(*xs):
        return [tf.identity(x) for x in xs], boundary.backward

    outputs = identity(*tensors)
    boundary.outputs = tuple(outputs)
    _step_record.add_boundary(boundary)
    return list(outputs)
