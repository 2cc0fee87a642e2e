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

import dataclasses
import math
import types
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

FLOAT16_MAX = 65504.0
"""Largest finite float16 value."""
FLOAT16_TINY = 2.0**-24
"""Smallest positive float16 value (subnormal), the paper's `u_min`."""
MIN_SCALE = 2.0**-24
"""Floor of every scale: 100 overflows in a row end here, never at zero."""
MAX_SCALE = 2.0**64
"""Ceiling of every scale: unscaled float32 gradients stay normal below it."""
BACKOFF = 2.0**-4
"""Factor applied to the scale of every component an overflow reached."""
HEADROOM_STEP = 4.0
"""Binades of headroom a measured scale gains each time an overflow reaches it."""
HEADROOM_DECAY_STEPS = 1000
"""Steps without an overflow after which a component's headroom shrinks by one binade."""
MAX_HEADROOM = 40.0
"""Most headroom a component can gain (binades)."""
BLIND_GROWTH = 2.0**16
"""Growth of a scale whose gradients were all zero (nothing to measure).

Zero at scale `s` means every value was below `FLOAT16_TINY / s`; times
`BLIND_GROWTH` they stay below `2**-8`, so this growth cannot overflow.
"""


class Statistics(NamedTuple):
    """What the last step saw in each scale component.

    Every array has one entry per component, in true (unscaled) units.

    Attributes:
        amax: Largest absolute gradient value seen in the component: at the
            inputs of its wrapped layers and in its weight gradients. Zero where
            every value was zero; inf or NaN where a non-finite value was seen.
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
    array([2.0000000e+00, 5.9604645e-08, 1.8446744e+19], dtype=float32)
    """
    x = tf.convert_to_tensor(x, tf.float32)
    x = tf.where(tf.math.is_nan(x), tf.ones_like(x), x)
    x = tf.clip_by_value(x, MIN_SCALE, MAX_SCALE)
    # Every value here is a positive normal float32: clearing the mantissa bits
    # leaves 2**exponent exactly (a logarithm can round 2**13 down to 2**12).
    bits = tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32), tf.constant(0x7F800000, tf.int32))
    return tf.bitcast(bits, tf.float32)


@keras.saving.register_keras_serializable(package="keras_als")
@dataclasses.dataclass(frozen=True)
class MaxSafe:
    """The largest power of two that keeps the largest gradient finite.

    `scale = 2**floor(log2(FLOAT16_MAX / amax)) / 2**margin`, from the last
    step's largest gradient value (delayed scaling, as in NVIDIA Transformer
    Engine's amax recipe). The `margin` absorbs growth from one batch to the
    next and sums inside a layer's backward pass that the statistics do not
    see; a component whose gradients were all zero grows by `BLIND_GROWTH`.

    The default margin was measured: a CNN with BatchNormalization on digits
    (Adam, 456 steps) skipped 235, 141, 87, 16, 0 and 0 steps with margins 1,
    2, 3, 4, 6 and 8, at equal accuracy. Six powers of two of headroom still
    keep about 33 binades of float16 below the largest gradient.

    Args:
        margin: Powers of two of headroom below `FLOAT16_MAX`.

    Example:

    >>> stats = Statistics(amax=np.array([1.0, 0.0], np.float32),
    ...                    mean_square=np.zeros(2, np.float32),
    ...                    overflow=np.zeros(2, bool))
    >>> next_scale(MaxSafe(margin=2), stats, np.ones(2, np.float32)).numpy()
    array([ 8192., 65536.], dtype=float32)
    """

    margin: int = 6

    def __post_init__(self):
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"MaxSafe(margin=...) takes a whole number >= 0, got {self.margin!r}.")

    def __call__(self, statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
        amax = tf.convert_to_tensor(statistics.amax, tf.float32)
        scale = tf.convert_to_tensor(scale, tf.float32)
        safe = FLOAT16_MAX / 2.0**self.margin / tf.maximum(amax, 1e-38)
        return tf.where(amax > 0, safe, scale * BLIND_GROWTH)

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_als")
@dataclasses.dataclass(frozen=True)
class ApproxRange:
    """The paper's rule: bound the expected underflow rate of each layer.

    Zhao, Vogel and Ahmed (2019) model a layer's input gradient as a zero-mean
    Gaussian with standard deviation `sd` and choose the scale at which at most
    `underflow_rate` of it falls below `u_min = FLOAT16_TINY`:

        z = sqrt(2) * erfinv(underflow_rate)
        alpha = u_min / (z * sd) / P        # P: scale the gradient arrives with
        alpha = clip(alpha, 1, max_ratio)   # per-layer bound (paper: 16)
        scale = min(P * alpha, max_scale)   # accumulated bound (paper: 1024)
        scale = min(scale, FLOAT16_MAX / amax)   # overflow bound

    rounded down to a power of two. The paper predicts `sd` from moments of the
    incoming gradient and of the weights because it has no earlier step; here
    `sd` is measured on the previous step (`sqrt(mean_square)`), and `P` is the
    smallest current scale among the components downstream (1 for the loss's).
    The defaults are the paper's; `max_ratio=None, max_scale=None` lifts the
    bounds, which cap very deep nets far below what they need.

    Args:
        underflow_rate: Tolerated expected share of underflowing values.
        max_ratio: Largest ratio between a component and its downstream, or None.
        max_scale: Largest absolute scale, or None.

    Example:

    >>> stats = Statistics(amax=np.array([1e-6], np.float32),
    ...                    mean_square=np.array([1e-14], np.float32),
    ...                    overflow=np.zeros(1, bool), downstream=((),))
    >>> next_scale(ApproxRange(), stats, np.ones(1, np.float32)).numpy()  # capped at 16
    array([16.], dtype=float32)
    """

    underflow_rate: float = 1e-3
    max_ratio: float | None = 16.0
    max_scale: float | None = 1024.0

    def __post_init__(self):
        if not 0.0 < self.underflow_rate < 1.0:
            raise ValueError(
                "ApproxRange(underflow_rate=...) must lie strictly between 0 and 1, "
                f"got {self.underflow_rate!r}."
            )
        for name in ("max_ratio", "max_scale"):
            value = getattr(self, name)
            if value is not None and not value >= 1.0:
                raise ValueError(f"ApproxRange({name}=...) must be None or >= 1, got {value!r}.")

    def __call__(self, statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
        amax = tf.convert_to_tensor(statistics.amax, tf.float32)
        scale = tf.convert_to_tensor(scale, tf.float32)
        mean_square = tf.convert_to_tensor(statistics.mean_square, tf.float32)
        z = math.sqrt(2.0) * _erfinv(self.underflow_rate)
        sd = tf.sqrt(mean_square)
        target = FLOAT16_TINY / (z * tf.maximum(sd, 1e-38))
        arriving = _arriving_scale(statistics, scale)
        ratio = tf.maximum(target / arriving, 1.0)
        if self.max_ratio is not None:
            ratio = tf.minimum(ratio, self.max_ratio)
        proposed = arriving * ratio
        if self.max_scale is not None:
            proposed = tf.minimum(proposed, self.max_scale)
        proposed = tf.where(
            amax > 0, tf.minimum(proposed, FLOAT16_MAX / tf.maximum(amax, 1e-38)), proposed
        )
        return tf.where(sd > 0, proposed, scale)

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)


def _erfinv(y: float) -> float:
    """Inverse error function for 0 < y < 1, by Newton's method on `math.erf`."""
    x = 0.0
    for _ in range(100):
        step = (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-15:
            break
    return x


def _arriving_scale(statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
    """Per component, the smallest scale among the components downstream of it."""
    n = int(scale.shape[0])
    downstream = statistics.downstream or ((),) * n
    arriving = [
        tf.reduce_min(tf.gather(scale, list(d))) if d else tf.constant(1.0) for d in downstream
    ]
    return tf.stack(arriving) if arriving else scale


@keras.saving.register_keras_serializable(package="keras_als")
@dataclasses.dataclass(frozen=True)
class Fixed:
    """Given scales, for baselines and tests: `scales[name]`, else `default`.

    Args:
        default: Scale of every component not named in `scales`.
        scales: Scale per component name (a wrapped layer's name or `"loss"`).

    Example:

    >>> stats = Statistics(amax=np.ones(2), mean_square=np.ones(2),
    ...                    overflow=np.zeros(2, bool), names=("loss", "dense"))
    >>> next_scale(Fixed(scales={"dense": 8.0}), stats, np.ones(2)).numpy()
    array([1., 8.], dtype=float32)
    """

    default: float = 1.0
    scales: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for value in [self.default, *self.scales.values()]:
            if not (value > 0 and math.frexp(value)[0] == 0.5):
                raise ValueError(f"Fixed scales must be powers of two (2.0**k), got {value!r}.")

    def __hash__(self):
        return hash((self.default, tuple(sorted(self.scales.items()))))

    def __call__(self, statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
        n = int(np.shape(scale)[0])
        names = statistics.names or ("",) * n
        return tf.constant([self.scales.get(name, self.default) for name in names], tf.float32)

    def get_config(self) -> dict:
        return {"default": self.default, "scales": dict(self.scales)}

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)


Policy = MaxSafe | ApproxRange | Fixed


def back_off(scale: tf.Tensor, safe_scale: tf.Tensor) -> tf.Tensor:
    """The scale after an overflow reached a component: `BACKOFF` times lower,
    and no higher than `safe_scale`, the scale of its last finite measuring
    step. A measurement can raise a scale by many binades (gradients far below
    float16's range); when the next steps' gradients grow as far (ConvNeXt's
    layer scales start at 1e-6, and Adam's first update moves them by its
    learning rate), backing off by `BACKOFF` alone would take a skipped step
    per `BACKOFF`, and returning to the scale that held takes one.

        scale = power_of_two_floor(min(scale * BACKOFF, safe_scale))

    Example:

    >>> back_off(np.array([2.0**30, 2.0**20], np.float32),
    ...          np.array([2.0**15, 2.0**20], np.float32)).numpy()  # raised far; steady
    array([32768., 65536.], dtype=float32)
    """
    scale = tf.convert_to_tensor(scale, tf.float32)
    safe_scale = tf.convert_to_tensor(safe_scale, tf.float32)
    return power_of_two_floor(tf.minimum(scale * BACKOFF, safe_scale))


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


class Headroom(NamedTuple):
    """Headroom learned from overflows, per component (the state of `after_overflow`).

    Attributes:
        binades: Extra powers of two of headroom, as of step `since`.
        since: The step (float32) at which an overflow last raised it.

    Example:

    >>> h = Headroom(binades=np.array([8.0, 0.0], np.float32), since=np.zeros(2, np.float32))
    >>> headroom_at(h, 2500.0).numpy()  # two decays of one binade each
    array([6., 0.], dtype=float32)
    """

    binades: tf.Tensor
    since: tf.Tensor


def headroom_at(headroom: Headroom, step: tf.Tensor) -> tf.Tensor:
    """The headroom left at `step`, per component:

    max(0, binades - floor((step - since) / HEADROOM_DECAY_STEPS))

    Example:

    >>> h = Headroom(binades=np.array([4.0], np.float32), since=np.array([100.0], np.float32))
    >>> headroom_at(h, 1099.0).numpy(), headroom_at(h, 1100.0).numpy()
    (array([4.], dtype=float32), array([3.], dtype=float32))
    """
    binades = tf.convert_to_tensor(headroom.binades, tf.float32)
    elapsed = tf.cast(step, tf.float32) - tf.convert_to_tensor(headroom.since, tf.float32)
    return tf.maximum(binades - tf.floor(elapsed / HEADROOM_DECAY_STEPS), 0.0)


def after_overflow(
    headroom: Headroom,
    reached: tf.Tensor,
    origin: tf.Tensor,
    step: tf.Tensor,
    measured: tf.Tensor | None = None,
) -> Headroom:
    """The headroom after an overflow at `step`.

    `origin` marks the components where the overflow started, `reached` those
    it reached (the origins and everything upstream of them, which saw its
    non-finite values). The origins gain `HEADROOM_STEP` binades; a component
    the overflow only passed through is raised to the origins' new level, not
    by a step of its own, so that layers far upstream do not add up the
    headroom of every overflow that passed them; every other component in
    `measured` is raised to at least `HEADROOM_STEP`, for the spikes the same
    kind of batch brings elsewhere:

        now     = headroom_at(step)
        raised  = min(now + HEADROOM_STEP, MAX_HEADROOM)
        level   = max of raised over the origins
        binades = raised          where origin
        binades = level           where reached, not origin, and level > now
        binades = HEADROOM_STEP   where measured, not reached, and HEADROOM_STEP > now
        since   = step            where binades changed (elsewhere both stay)

    (the last `binades` line only when the overflow has an origin).

    Pass in `reached`, `origin` and `measured` only the components whose scale
    was chosen from a measurement: an overflow of a first guess says nothing
    about spikes, and a first guess has nothing to plan headroom for.
    `measured=None` raises no component the overflow did not reach.

    Example:

    >>> h = Headroom(binades=np.array([0.0, 6.0, 0.0, 1.0], np.float32),
    ...              since=np.zeros(4, np.float32))
    >>> reached = np.array([True, True, True, False])
    >>> origin = np.array([True, False, False, False])
    >>> after = after_overflow(h, reached, origin, 10.0, measured=np.ones(4, bool))
    >>> after.binades.numpy(), after.since.numpy()
    (array([4., 6., 4., 4.], dtype=float32), array([10.,  0., 10., 10.], dtype=float32))
    """
    reached = tf.convert_to_tensor(reached, tf.bool)
    origin = tf.logical_and(tf.convert_to_tensor(origin, tf.bool), reached)
    step = tf.cast(step, tf.float32)
    now = headroom_at(headroom, step)
    raised = tf.minimum(now + HEADROOM_STEP, MAX_HEADROOM)
    level = tf.reduce_max(tf.where(origin, raised, 0.0))
    passed = reached & ~origin & (level > now)
    elsewhere = tf.zeros_like(reached)
    if measured is not None:
        elsewhere = tf.convert_to_tensor(measured, tf.bool) & ~reached
        elsewhere = elsewhere & tf.reduce_any(origin) & (HEADROOM_STEP > now)
    changed = origin | passed | elsewhere
    binades = tf.convert_to_tensor(headroom.binades, tf.float32)
    since = tf.convert_to_tensor(headroom.since, tf.float32)
    binades = tf.where(elsewhere, HEADROOM_STEP, binades)
    return Headroom(
        binades=tf.where(origin, raised, tf.where(passed, level, binades)),
        since=tf.where(changed, tf.fill(tf.shape(since), step), since),
    )


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
