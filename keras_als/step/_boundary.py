"""The scale boundary: an identity whose gradient is divided by a power of two.

`insert(owner, tensors)` places one boundary on floating-point tensors a
scaled layer receives (`_layer_call` places one per input, since inputs
from different regions need different divisors). Forward, it is an identity.
Backward, its gradient function hands the gradient arriving from the layer to
the plan's `crossings` (which reduce it for the statistics on the steps that
measure; a large one then waits for its reductions, through an exact zero
added to its factor) and divides it by the layer's scale over the scale
upstream: a power of two that the optimizer's plan sets before backprop
starts. Every boundary made while tracing a graph goes into the step's record
(`_step_record`), so that the plan can find the scale components of that graph.

Why a division, where a multiply by the reciprocal gives the same bits (both
are exact for a power of two): XLA's CPU compiler counts a floating-point
division as expensive and computes it once, where it recomputes a multiply,
and the cheap operations behind it, inside every fusion that reads the
gradient (a transformer's layer norms read a gradient in several reductions
each; a convolution's gradient is read by two convolutions, for its input and
its filter; a concatenation's by a slice per input). A division is written
once, in float32, and cuts those chains. Other feature maps are another
matter: large, read by one fusion (an activation's gradient), and written in
float32 they raise the step's peak memory. So a boundary whose tensors are
all of rank `DIVIDED_RANK` or less (tokens' features, vectors) or made by one
of `DIVIDED_OPERATIONS` (convolutions, concatenations) `divides`, and one
with other feature maps multiplies by the reciprocal, which XLA writes
nowhere (`python -m benchmarks.real_models --parts cost --models bert_tiny`
and `--parts memory --models mobilenet_v2`, `python -m
benchmarks.cost_at_size --models densenet_4x4 --ablation
feature_maps_multiplied` measure the choices). The plan computes every
boundary's factor, divisor or reciprocal, from two scales read through
runtime indices (`_indices`), so that XLA compiles one rescaling for all the
boundaries of one shape.

Outside a traced function there is no graph to walk, so `insert` returns the
tensors unchanged.
"""

from __future__ import annotations

import weakref

import tensorflow as tf

from keras_als._keras_private import entry_layer
from keras_als.step import _step_record


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
        divides: Whether its gradient is divided by `factor` (every input of
            rank `DIVIDED_RANK` or less or made by one of
            `DIVIDED_OPERATIONS`) or multiplied by it (the factor is then the
            reciprocal of the divisor).
        factor: Scalar float32 power of two, handed over by the plan
            (`connect`); None leaves the gradient unchanged.
        crossings: The plan's `_crossings.Crossings`, which take the gradient
            arriving from the wrapped layer's side (at the scale of that side),
            before the division; None: nobody measures it.
    """

    def __init__(self, owner, inputs, limit):
        self._owner = weakref.ref(owner)
        self.inputs = tuple(inputs)
        self.limit = limit
        self.outputs: tuple = ()
        self.divides = all(_divides(t) for t in self.inputs)
        self.factor: tf.Tensor | None = None
        self.crossings = None

    @property
    def owner(self):
        return self._owner()

    def connect(self, factor: tf.Tensor | None, crossings) -> None:
        """Takes the plan's factor and crossings for the backward pass."""
        self.factor = factor
        self.crossings = crossings

    def backward(self, *gradients):
        factor = self.factor
        if self.crossings is not None:
            zero = self.crossings.arrived(self, [g for g in gradients if g is not None])
            if zero is not None:  # the gradients wait for their reductions (`_crossings`)
                factor = zero + (1.0 if factor is None else factor)
        if factor is None:
            return list(gradients)
        return [None if g is None else rescale(g, factor, self.divides) for g in gradients]


DIVIDED_RANK = 3
"""A boundary whose inputs are all of at most this rank divides its gradients;
one with a larger input multiplies them by the divisor's reciprocal, unless
`DIVIDED_OPERATIONS` made it (see the module docstring)."""


DIVIDED_OPERATIONS = frozenset({"ConcatV2", "Conv2D", "DepthwiseConv2dNative"})
"""TensorFlow operations whose output gradient is read by several kernels
(a convolution's by the convolutions for its input and its filter, a
concatenation's by a slice per input): a boundary on feature maps all made by
them divides too."""


def _divides(tensor: tf.Tensor) -> bool:
    rank = tensor.shape.rank
    if rank is None:
        return False
    made_by = getattr(tensor, "op", None)  # None for an eager tensor a graph captured
    return rank <= DIVIDED_RANK or (made_by is not None and made_by.type in DIVIDED_OPERATIONS)


def rescale(gradient: tf.Tensor, factor: tf.Tensor, divides: bool) -> tf.Tensor:
    """`gradient / factor` if `divides`, else `gradient * factor`, computed in
    float32 so that any power of two is exact."""
    wide = tf.cast(gradient, tf.float32)
    return tf.cast(wide / factor if divides else wide * factor, gradient.dtype)


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
    _step_record.add_boundary(boundary, entered=entry_layer())
    return list(outputs)
