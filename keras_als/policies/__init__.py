"""Scale policies: pure functions from last step's statistics to next scales.

A *scale component* is a region of the backward graph whose gradients all carry
one scale (see `keras_als.AdaptiveLossScaleOptimizer`). After every step the
optimizer measures, per component, the statistics in `Statistics` (in true,
unscaled units) and asks a policy for the next scales:

    next_scale = policy(statistics, scale)

A policy is a frozen dataclass with no state of its own beyond its parameters;
`scale` (the current scales) is the state. Every policy returns powers of two
within `[MIN_SCALE, MAX_SCALE]`, so scaling never changes the mathematics.
Non-finite statistics never reach a policy: `next_scale` handles them (every
component an overflow reached backs off by `BACKOFF`, the others keep their
scale).

Overflows also teach the scales. A component where an overflow started
gains `HEADROOM_STEP` binades of *headroom*, and the components upstream that
the overflow passed through are raised to the same level (a spike in the loss
is as large, relative to the ordinary gradients, all the way down): the policy
then plans for a largest gradient `2**headroom` times the one it measured, so a
spike that recurs (a rare sample with a far larger loss) is held instead of
skipped again. The batch that overflowed one component tends to spike others
too (ResNet50V2's weight gradients overflowed in ten components at once, then
in an eleventh a hundred steps later), so every other measured component is
raised to at least `HEADROOM_STEP`. Only measured scales learn headroom. The
headroom shrinks by one binade per `HEADROOM_DECAY_STEPS` steps without
another overflow (`Headroom`, `headroom_at`, `after_overflow`).

Example:

>>> import numpy as np
>>> from keras_als import policies
>>> stats = policies.Statistics(
...     amax=np.array([1.0, 2.0**-20], np.float32),
...     mean_square=np.zeros(2, np.float32),
...     overflow=np.array([False, False]))
>>> policies.next_scale(policies.MaxSafe(margin=1), stats, np.ones(2, np.float32)).numpy()
array([1.6384000e+04, 1.7179869e+10], dtype=float32)
"""

from __future__ import annotations

import types

import numpy as np  # noqa: F401 (the docstring examples, which run here, use it)
import tensorflow as tf

from keras_als.policies import _overflows, _policy_rules, _policy_terms
from keras_als.policies._overflows import (
    Headroom,
    after_overflow,
    back_off,
    headroom_at,
    overflow_origins,
)
from keras_als.policies._policy_rules import ApproxRange, Fixed, MaxSafe
from keras_als.policies._policy_terms import Statistics, power_of_two_floor

__all__ = [
    "BACKOFF",
    "BLIND_GROWTH",
    "FLOAT16_MAX",
    "FLOAT16_TINY",
    "HEADROOM_DECAY_STEPS",
    "HEADROOM_STEP",
    "MAX_HEADROOM",
    "MAX_SCALE",
    "MIN_SCALE",
    "ApproxRange",
    "Fixed",
    "Headroom",
    "MaxSafe",
    "Policy",
    "Statistics",
    "after_overflow",
    "back_off",
    "get",
    "headroom_at",
    "next_scale",
    "overflow_origins",
    "power_of_two_floor",
    "rise_after_first_update",
]

FLOAT16_MAX = _policy_terms.FLOAT16_MAX
"""Largest finite float16 value."""
FLOAT16_TINY = _policy_terms.FLOAT16_TINY
"""Smallest positive float16 value (subnormal), the paper's `u_min`."""
MIN_SCALE = _policy_terms.MIN_SCALE
"""Floor of every scale: 100 overflows in a row end here, never at zero."""
MAX_SCALE = _policy_terms.MAX_SCALE
"""Ceiling of every scale: unscaled float32 gradients stay normal below it."""
BACKOFF = _overflows.BACKOFF
"""Factor applied to the scale of every component an overflow reached."""
HEADROOM_STEP = _overflows.HEADROOM_STEP
"""Binades of headroom a measured scale gains each time an overflow reaches it."""
HEADROOM_DECAY_STEPS = _overflows.HEADROOM_DECAY_STEPS
"""Steps without an overflow after which a component's headroom shrinks by one binade."""
MAX_HEADROOM = _overflows.MAX_HEADROOM
"""Most headroom a component can gain (binades)."""
BLIND_GROWTH = _policy_rules.BLIND_GROWTH
"""Growth of a scale whose gradients were all zero (nothing to measure).

Zero at scale `s` means every value was below `FLOAT16_TINY / s`; times
`BLIND_GROWTH` they stay below `2**-8`, so this growth cannot overflow.
"""

Policy = MaxSafe | ApproxRange | Fixed


def rise_after_first_update(proposed: tf.Tensor, scale: tf.Tensor, updated) -> tf.Tensor:
    """The scales to use: `proposed`, but none above `scale` before the first
    update. A measurement before any update was applied saw the gradients of
    the weights as initialised, which one update can move by orders of
    magnitude: Adam moves every weight by about its learning rate, a
    thousandfold for ConvNeXt's layer scales (initialised at `1e-6`), and the
    gradients of the layers below them grow as much. Such a measurement may
    lower a scale (a gradient that the first guess overflows soon), not raise
    it; the next step measures again, one update later.

        scale = proposed              once updated
        scale = min(proposed, scale)  before

    Example:

    >>> proposed = np.array([2.0**30, 2.0**10], np.float32)
    >>> scale = np.array([2.0**15, 2.0**15], np.float32)
    >>> rise_after_first_update(proposed, scale, updated=False).numpy()
    array([32768.,  1024.], dtype=float32)
    >>> rise_after_first_update(proposed, scale, updated=True).numpy()
    array([1.0737418e+09, 1.0240000e+03], dtype=float32)
    """
    proposed = tf.convert_to_tensor(proposed, tf.float32)
    scale = tf.convert_to_tensor(scale, tf.float32)
    return tf.where(tf.convert_to_tensor(updated, tf.bool), proposed, tf.minimum(proposed, scale))


_BY_NAME = types.MappingProxyType(
    {"max_safe": MaxSafe, "approx_range": ApproxRange, "fixed": Fixed}
)


def get(identifier: str | Policy) -> Policy:
    """Returns a policy from its name (`"max_safe"`, ...) or returns it as is.

    Example:

    >>> get("approx_range")
    ApproxRange(underflow_rate=0.001, max_ratio=16.0, max_scale=1024.0)
    """
    if isinstance(identifier, (MaxSafe, ApproxRange, Fixed)):
        return identifier
    if isinstance(identifier, str) and identifier in _BY_NAME:
        return _BY_NAME[identifier]()
    raise ValueError(
        f"Unknown scale policy {identifier!r}: pass one of {sorted(_BY_NAME)} or an "
        "instance such as keras_als.policies.MaxSafe(margin=2)."
    )


def next_scale(
    policy: Policy,
    statistics: Statistics,
    scale: tf.Tensor,
    headroom: tf.Tensor | None = None,
) -> tf.Tensor:
    """The scales for the next step: the policy's where the statistics are finite.

    Where an overflow reached a component (`statistics.overflow`) its scale
    backs off by `BACKOFF`; where its statistics are not finite otherwise, or
    no gradient arrived at all (`silent`), it stays; elsewhere the policy
    decides, planning for a largest gradient of `amax * 2**headroom` (the
    headroom learned from overflows, in binades; None: none).
    The result is always a power of two within `[MIN_SCALE, MAX_SCALE]`.

    Example:

    >>> stats = Statistics(amax=np.array([np.inf, np.nan], np.float32),
    ...                    mean_square=np.zeros(2, np.float32),
    ...                    overflow=np.array([True, False]))
    >>> next_scale(MaxSafe(), stats, np.array([1024.0, 8.0], np.float32)).numpy()
    array([64.,  8.], dtype=float32)
    """
    scale = tf.convert_to_tensor(scale, tf.float32)
    amax = tf.convert_to_tensor(statistics.amax, tf.float32)
    overflow = tf.convert_to_tensor(statistics.overflow, tf.bool)
    informed = tf.math.is_finite(amax)
    if statistics.silent is not None:
        informed = tf.logical_and(informed, tf.logical_not(statistics.silent))
    if headroom is not None:
        planned = amax * tf.pow(2.0, tf.convert_to_tensor(headroom, tf.float32))
        statistics = statistics._replace(amax=planned)
    proposed = policy(statistics, scale)
    chosen = tf.where(overflow, scale * BACKOFF, tf.where(informed, proposed, scale))
    return power_of_two_floor(chosen)


def _present_here(*objects) -> None:
    """Makes this module the home of `objects`, defined in private modules: as
    before they moved there, `__module__` (which repr, pickle, Keras's saved
    configs, Sphinx and the doctests read) says `keras_als.policies`."""
    for value in objects:
        value.__module__ = __name__


_present_here(
    Statistics,
    power_of_two_floor,
    MaxSafe,
    ApproxRange,
    Fixed,
    back_off,
    Headroom,
    headroom_at,
    after_overflow,
    overflow_origins,
)
