"""What a step writes into the state per scale (`_state.ScaleState`).

The state's table (`_state.PER_SCALE`) has one column per scale entry
(entry 0 the loss's, then one per trainable variable, `_entries`). A plan's
scale *components* each hold one or more entries (layers whose weights are
tied share a component). These functions read the state per component and
write each component's new value into all of its entries:

- `choose_scales` (measuring steps): the policy's next scales, with the
  headroom left;
- `record_measurement` (measuring steps): which scales now come from a
  measurement (`MEASURED`); the underflow shares, for the telemetry (the caller `write`s
  the rows of both in one assignment);
- `learn_from_overflow` (skipped steps): back off, headroom, where the
  overflow started;
- `underflow` (measuring steps, for `record_measurement`): the underflow
  shares per component.

`state` below is the optimizer's `_state.ScaleState` (its `scaling`).
"""

from __future__ import annotations

import tensorflow as tf

from keras_als import policies
from keras_als.step import _state, _statistics

FLUSH_PROPAGATION = 8
"""Components upstream of a flushed gradient marked as underflowed whole."""

MEASURED = 1.0
"""Flag: the scale was chosen from a measurement (not: the first guess)."""
BEYOND_FLOAT16 = 2.0
"""Flag: an overflow started there at a scale below 1 (the gradients exceeded
float16's largest value), on any step so far, though the scale recovered
since. Older checkpoints, whose row held the first flag alone, load as they are."""


def per_component(plan, values) -> tf.Tensor:
    """Each component's value in a vector with one entry per scale (its own entry's)."""
    return tf.gather(tf.convert_to_tensor(values), [c.entry for c in plan.components])


def write(plan, state, rows: dict) -> None:
    """Writes each component's values into every entry it holds, for each row
    of `rows` (`{name in PER_SCALE: one value per component}`), in one
    assignment of the table; a `"scale"` row also sets the loss's scale,
    which Keras's `dynamic_scale` holds."""
    entries, components = _entries_of(plan)
    indices = [[_state.PER_SCALE.index(name), entry] for name in rows for [entry] in entries]
    values = tf.stack([tf.cast(rows[name], tf.float32) for name in rows])
    updates = tf.reshape(tf.gather(values, components, axis=1), [-1])
    state.assign(new_table=tf.tensor_scatter_nd_update(state.table(), indices, updates))
    if "scale" in rows:
        state.dynamic_scale.assign(tf.gather(rows["scale"], plan.loss_component))


def headroom_of(state, plan) -> policies.Headroom:
    """The headroom each component learned from overflows."""
    return policies.Headroom(
        per_component(plan, state.row("headroom")),
        per_component(plan, state.row("headroom_since")),
    )


def choose_scales(state, plan, statistics, finite, step, updated) -> tuple[tf.Tensor, dict]:
    """The policy's next scales, with the headroom left at `step`, none of them
    raised before the first update (`policies.rise_after_first_update`).

    Returns the policy's proposal and the rows to `write` (the new scales, and
    this step's as the last that was safe)."""
    headroom = policies.headroom_at(headroom_of(state, plan), step)
    proposed = policies.next_scale(state.policy, statistics, plan.scales, headroom)
    new = policies.rise_after_first_update(proposed, plan.scales, updated)
    safe = plan.scales
    if _statistics.several_replicas():  # this runs on skipped steps too
        new = tf.where(finite, new, per_component(plan, state.vector()))
        safe = tf.where(finite, safe, per_component(plan, state.row("safe_scale")))
    return proposed, {"safe_scale": safe, "scale": new}


def record_measurement(state, plan, statistics, gradients) -> dict:
    """The rows to `write`: which scales now come from a measurement, and the
    underflow (telemetry)."""
    informed = tf.logical_and(tf.math.is_finite(statistics.amax), tf.logical_not(statistics.silent))
    was = per_component(plan, state.row("flags"))
    rows = {"flags": tf.where(informed, was - has_flag(was, MEASURED) + MEASURED, was)}
    if not state.estimate_underflow:
        # Without the counts, only the whole losses: 1 where every gradient
        # of the component flushed to zero at its scale, 0 elsewhere.
        lost, silent = whole_losses(plan, statistics)
        before = per_component(plan, state.row("underflow_rates"))
        return {**rows, "underflow_rates": tf.where(silent, before, tf.cast(lost, before.dtype))}
    subnormal, zero = underflow(
        plan,
        statistics,
        gradients.weight_grads,
        gradients.float16,
        before=(
            per_component(plan, state.row("underflow_rates")),
            per_component(plan, state.row("zero_rates")),
        ),
    )
    return {**rows, "underflow_rates": subnormal, "zero_rates": zero}


def learn_from_overflow(state, plan, reached, step) -> None:
    """On a skipped step: every component the overflow reached backs off, by
    `BACKOFF` and at least to the scale of its last measuring step (finite),
    so a scale that the last measurement raised far returns at once to one
    that held (`policies.back_off`); where the overflow started
    (`policies.overflow_origins`) the measured scales gain headroom and the other
    measured ones rise to at least one step of it (`policies.after_overflow`);
    telemetry notes the origin, and flags `BEYOND_FLOAT16` where its scale
    was below 1."""
    safe = per_component(plan, state.row("safe_scale"))
    scales = tf.where(reached, policies.back_off(plan.scales, safe), plan.scales)
    origin = policies.overflow_origins(reached, plan.downstream())
    flags = per_component(plan, state.row("flags"))
    measured = has_flag(flags, MEASURED) > 0
    headroom = policies.after_overflow(
        headroom_of(state, plan),
        reached=tf.logical_and(reached, measured),
        origin=tf.logical_and(origin, measured),
        step=step,
        measured=measured,
    )
    counts = per_component(plan, state.row("overflow_counts"))
    last = per_component(plan, state.row("last_overflow_step"))
    below_one = tf.logical_and(origin, plan.scales < 1.0)
    beyond = tf.cast(tf.logical_and(below_one, has_flag(flags, BEYOND_FLOAT16) == 0), flags.dtype)
    rows = {
        "scale": scales,
        "flags": flags + BEYOND_FLOAT16 * beyond,
        "headroom": headroom.binades,
        "headroom_since": headroom.since,
        "overflow_counts": counts + tf.cast(origin, counts.dtype),
        "last_overflow_step": tf.where(origin, tf.fill(tf.shape(last), step), last),
    }
    write(plan, state, rows)


def has_flag(flags, flag: float):
    """`flag` where `flags` (values of the `"flags"` row) hold it, else 0."""
    return flag * (tf.math.floormod(tf.math.floor(flags / flag), 2.0))


def _entries_of(plan) -> tuple[list[list[int]], list[int]]:
    """`([entry], component)` pairs: every entry of `plan`'s components, and whose it is."""
    pairs = [([entry], i) for i, c in enumerate(plan.components) for entry in c.entries()]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def underflow(plan, statistics, weight_grads, float16, before) -> tuple[tf.Tensor, tf.Tensor]:
    """Per component, the shares of float16 subnormals and of exact zeros.

    Where a component's gradients were lost whole (`whole_losses`), its
    underflow share is 1. Where nothing reached a component, its shares stay
    as they were (`before`, a pair of vectors).
    """
    shares = tf.stack(_statistics.underflow_shares(plan, weight_grads, float16))
    subnormal, zero = tf.unstack(_statistics.mean_over_replicas(shares))
    lost, silent = whole_losses(plan, statistics)
    subnormal = tf.where(lost, tf.ones_like(subnormal), subnormal)
    return tf.where(silent, before[0], subnormal), tf.where(silent, before[1], zero)


def whole_losses(plan, statistics) -> tuple[tf.Tensor, tf.Tensor]:
    """`(lost, silent)` per component: where its gradients underflowed whole,
    and where nothing reached it (so this step says nothing about it).

    A gradient that rounded to zero whole at a boundary, or a component whose
    every gradient is zero though gradient reached it, underflowed whole (or
    its units are all dead), and so did the components upstream that
    received nothing (silent), up to `FLUSH_PROPAGATION` components away.
    """
    n = len(plan.components)
    silent = statistics.silent
    if silent is None:
        silent = tf.zeros([n], tf.bool)
    lost = tf.logical_and(tf.equal(statistics.amax, 0.0), tf.logical_not(silent))
    if statistics.flushed is not None:
        lost = tf.logical_or(statistics.flushed, lost)
    downstream = plan.downstream_matrix()
    for _ in range(FLUSH_PROPAGATION):
        below = tf.linalg.matvec(downstream, tf.cast(lost, tf.float32)) > 0
        lost = tf.logical_or(lost, tf.logical_and(silent, below))
    return lost, tf.logical_and(silent, tf.logical_not(lost))
