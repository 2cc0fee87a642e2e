"""The terms every scale policy shares: float16's range, the range of a scale,
the `Statistics` a policy reads, and rounding down to a power of two.

Public as `keras_als.policies`; the docstring examples run there.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

FLOAT16_MAX = 65504.0  # largest finite float16 value
FLOAT16_TINY = 2.0**-24  # smallest positive float16 value (subnormal), the paper's u_min
# Floor of every scale: a gradient up to 65504 * 2**40 (7.2e16) still fits
# float16 at it, as the start of a vision transformer on flat images needs
# (1.8e15 in KerasHub's Swin), and a float32 value above 2**-86 times it stays
# a normal float32 (so float32 training at it is exact).
MIN_SCALE = 2.0**-40
MAX_SCALE = 2.0**64  # ceiling of every scale


class Statistics(NamedTuple):
    """What the last step saw in each scale component.

    Every array has one entry per component, in true (unscaled) units.

    Attributes:
        amax: Largest absolute gradient value seen in the component: at the
            inputs of its wrapped layers and in its weight gradients (at a
            join's inputs, a bound on it: the sum of the values where the
            join's output goes). Zero where every value was zero; inf or NaN
            where a non-finite value was seen.
        mean_square: Mean of the squared gradient at the inputs of the wrapped
            layers in the component (where none is measured, such as a first
            layer, of its weight gradients). Only `ApproxRange` reads it.
        overflow: True where the step's gradients were not finite: where an
            overflow started and every component upstream that it reached.
        silent: True where no gradient reached the component (all that flowed
            in was zero, e.g. underflowed downstream), so a zero `amax` says
            nothing about it; None means never.
        downstream: For each component, the components whose gradients flow
            into it through a scale boundary (static structure).
        names: A name for each component: the wrapped layer whose scale
            variable holds it, or `"loss"` (static).
        flushed: True where a float16 gradient flowing into the component
            from downstream was not zero but rounds to zero, all of it, at the
            component's scale; None where not measured. The telemetry reads
            it, no policy does.

    Example:

    >>> import numpy as np
    >>> s = Statistics(amax=np.ones(1), mean_square=np.ones(1),
    ...                overflow=np.zeros(1, bool))
    >>> s.names
    ()
    """

    amax: tf.Tensor
    mean_square: tf.Tensor
    overflow: tf.Tensor
    silent: tf.Tensor | None = None
    downstream: tuple[tuple[int, ...], ...] = ()
    names: tuple[str, ...] = ()
    flushed: tf.Tensor | None = None


def power_of_two_floor(x: tf.Tensor) -> tf.Tensor:
    """Largest power of two at most `x`, clamped to `[MIN_SCALE, MAX_SCALE]`.

    Example:

    >>> power_of_two_floor(np.array([3.0, 0.0, np.inf], np.float32)).numpy()
    array([2.0000000e+00, 9.0949470e-13, 1.8446744e+19], dtype=float32)
    """
    x = tf.convert_to_tensor(x, tf.float32)
    x = tf.where(tf.math.is_nan(x), tf.ones_like(x), x)
    x = tf.clip_by_value(x, MIN_SCALE, MAX_SCALE)
    # Every value here is a positive normal float32: clearing the mantissa bits
    # leaves 2**exponent exactly (a logarithm can round 2**13 down to 2**12).
    bits = tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32), tf.constant(0x7F800000, tf.int32))
    return tf.bitcast(bits, tf.float32)
