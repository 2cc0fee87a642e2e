"""What overflows teach the scales: backing off, and headroom that decays.

A component an overflow reached backs off (`back_off`); one where it started
(`overflow_origins`) gains headroom, raised along the components it passed
through (`after_overflow`), which shrinks again without overflows
(`headroom_at`).
Public as `keras_als.policies`; the docstring examples run there.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from keras_als.policies._policy_terms import power_of_two_floor

BACKOFF = 2.0**-4  # factor applied to the scale of every component an overflow reached
HEADROOM_STEP = 4.0  # binades of headroom a measured scale gains per overflow
HEADROOM_DECAY_STEPS = 1000  # steps without an overflow per binade of headroom lost
MAX_HEADROOM = 40.0  # most headroom a component can gain (binades)


def overflow_origins(reached: tf.Tensor, downstream: tuple[tuple[int, ...], ...]) -> tf.Tensor:
    """Where an overflow started: the components it reached that no gradient
    from another reached component flowed into, except around a cycle.

    `downstream[c]` lists the components whose gradient flows into component
    `c` (`Statistics.downstream`). An overflow's non-finite values reach its
    origin and everything upstream, so an origin is a reached component with
    nothing reached downstream. Components can feed each other: a
    transformer's residual stream is one component (its joins share a scale),
    it feeds every branch (attention, MLP), and each branch's output joins it
    again. Such components form one *group* (they lie on a cycle), and a
    reached group with nothing reached downstream of any of its members,
    outside the group, is where the overflow started: every reached member
    is an origin. Without groups, a cycle would leave every reached component
    with a reached one downstream, and an overflow in a transformer's
    residual stream would have no origin: it would teach no headroom and
    recur every time the scales rise again.

        origin = reached, and nothing reached downstream of its group

    Example:

    >>> # 0: the loss; 1: a residual stream fed by the loss and by branch 2,
    >>> # which it feeds; 3: an embedding below the stream.
    >>> downstream = ((), (0, 2), (1,), (1,))
    >>> reached = np.array([False, True, True, True])
    >>> overflow_origins(reached, downstream).numpy()
    array([False,  True,  True, False])
    """
    reached = tf.convert_to_tensor(reached, tf.bool)
    across, together = (tf.constant(m, tf.float32) for m in _groups(downstream))
    reached_below = tf.linalg.matvec(across, tf.cast(reached, tf.float32))
    group_reached_below = tf.linalg.matvec(together, reached_below) > 0
    return tf.logical_and(reached, tf.logical_not(group_reached_below))


def _groups(downstream: tuple[tuple[int, ...], ...]) -> tuple[np.ndarray, np.ndarray]:
    """Two static matrices (computed when a step is traced): `across[c, d]` is 1
    where gradient flows from component `d` into `c` and the two lie in
    different groups; `together[c, d]` is 1 where `c` and `d` lie in one
    group (on a cycle, or are the same component)."""
    n = len(downstream)
    flows = np.zeros((n, n), bool)
    for c, feeding in enumerate(downstream):
        flows[c, list(feeding)] = True
    reach = flows | np.eye(n, dtype=bool)  # [c, d]: gradient from d gets to c
    while True:  # transitive closure by squaring: at most log2(n) rounds
        wider = (reach.astype(np.float32) @ reach.astype(np.float32)) > 0
        if (wider == reach).all():
            break
        reach = wider
    together = reach & reach.T
    return (flows & ~together).astype(np.float32), together.astype(np.float32)


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
