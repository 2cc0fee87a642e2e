"""What overflows teach the scales: backing off, and headroom that decays.

A component an overflow reached backs off (`back_off`); one where it started
gains headroom, raised along the components it passed through
(`after_overflow`), which shrinks again without overflows (`headroom_at`).
Public as `keras_als.policies`; the docstring examples run there.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from keras_als._policy_terms import power_of_two_floor

BACKOFF = 2.0**-4  # factor applied to the scale of every component an overflow reached
HEADROOM_STEP = 4.0  # binades of headroom a measured scale gains per overflow
HEADROOM_DECAY_STEPS = 1000  # steps without an overflow per binade of headroom lost
MAX_HEADROOM = 40.0  # most headroom a component can gain (binades)


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
