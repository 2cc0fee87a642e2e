"""The optimizer's state per scale, and what a step writes into it.

`declare` (called by `AdaptiveLossScaleOptimizer.build`) makes one vector
variable per kind of state, with one entry per scale: the loss's (entry 0), then each wrapped
layer's. A plan's scale *components* each hold one or more entries (layers
whose weights are tied share a component). These functions read the state
per component and write each component's new value into all of its entries:

- `choose_scales` (measuring steps): the policy's next scales, with the
  headroom left;
- `record_measurement` (measuring steps): which scales now come from a
  measurement; the underflow shares, for the telemetry;
- `learn_from_overflow` (skipped steps): back off, headroom, where the
  overflow started.

`state` below is the optimizer: its variables are the state.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_als import _statistics, _telemetry, policies
from keras_als._telemetry import SKIP_WINDOW


def declare(state, layers: int) -> None:
    """Makes the optimizer's variables, for the loss's scale and `layers` wrapped layers.

    Every replica computes the same new values (from all-reduced statistics),
    so each is written in replica context and kept from the first replica.
    """

    def variable(name, dtype="float32", initial=state.initial_scale, shape=()):
        return state.add_variable(
            shape=shape,
            dtype=dtype,
            initializer=keras.initializers.Constant(initial),
            aggregation="only_first_replica",
            name=name,
        )

    entries = (layers + 1,)  # the loss's, then each layer's
    # One vector for every layer's scale: one variable costs the compiled
    # step less than one per layer.
    state._layer_scales = variable("layer_scales", shape=(layers,))
    state.skipped_steps = variable("skipped_steps", "int", 0)
    # What overflows taught each scale (policies.Headroom), and whether it
    # was ever chosen from a measurement (1) or is still the first guess (0).
    state.headroom = variable("headroom", "float32", 0.0, shape=entries)
    state.headroom_since = variable("headroom_since", "float32", 0.0, shape=entries)
    state.measured = variable("measured", "int", 0, shape=entries)
    # Telemetry: where overflows started and when; the recent skips.
    state.overflow_counts = variable("overflow_counts", "int", 0, shape=entries)
    state.last_overflow_step = variable("last_overflow_step", "float32", -1.0, shape=entries)
    state.underflow_rates = variable("underflow_rates", "float32", 0.0, shape=entries)
    state.zero_rates = variable("zero_rates", "float32", 0.0, shape=entries)
    state.recent_skips = variable("recent_skips", "int", 0, shape=(SKIP_WINDOW,))
    state.skipped_in_a_row = variable("skipped_in_a_row", "int", 0)
    # Finite steps since the boundaries last measured.
    state.steps_since_measured = variable("steps_since_measured", "int", 0)
    # LossScaleOptimizer's own state, with the aggregation above: the loss's
    # scale, and the growth counter of the one dynamic scale of an eager step.
    state.step_counter = variable("step_counter", "int", 0)
    state.dynamic_scale = variable("dynamic_scale")


def per_component(plan, values) -> tf.Tensor:
    """Each component's value in a vector with one entry per scale (its own entry's)."""
    return tf.gather(tf.convert_to_tensor(values), [c.entry for c in plan.components])


def write(plan, variable, values) -> None:
    """Writes each component's value (`values`) into every entry of `variable` it holds."""
    variable.assign(_with_values(plan, tf.convert_to_tensor(variable), values))


def assign_scales(state, plan, new) -> None:
    """Writes the new scale of every component into each of its entries (the
    loss's scale and the layers' are two variables)."""
    updated = _with_values(plan, plan.scale_vector, new)
    state.dynamic_scale.assign(updated[0])
    state._layer_scales.assign(updated[1:])


def _with_values(plan, vector, values) -> tf.Tensor:
    """`vector` (one entry per scale) with each component's value in all its entries."""
    entries, components = _entries_of(plan)
    return tf.tensor_scatter_nd_update(vector, entries, tf.gather(values, components))


def headroom_of(state, plan) -> policies.Headroom:
    """The headroom each component learned from overflows."""
    return policies.Headroom(
        per_component(plan, state.headroom), per_component(plan, state.headroom_since)
    )


def choose_scales(state, plan, statistics, finite, step) -> tf.Tensor:
    """The policy's next scales, with the headroom left at `step`; assigns them."""
    headroom = policies.headroom_at(headroom_of(state, plan), step)
    new = policies.next_scale(state.policy, statistics, plan.scales, headroom)
    if _statistics.several_replicas():  # this runs on skipped steps too
        new = tf.where(finite, new, per_component(plan, state.scale_vector()))
    assign_scales(state, plan, new)
    return new


def record_measurement(state, plan, statistics, gradients) -> None:
    """Notes which scales now come from a measurement, and the underflow (telemetry)."""
    informed = tf.logical_and(tf.math.is_finite(statistics.amax), tf.logical_not(statistics.silent))
    was = per_component(plan, state.measured)
    write(plan, state.measured, tf.where(informed, tf.ones_like(was), was))
    if not state.estimate_underflow:
        return
    subnormal, zero = _telemetry.underflow(
        plan,
        statistics,
        gradients.weight_grads,
        gradients.float16,
        before=(per_component(plan, state.underflow_rates), per_component(plan, state.zero_rates)),
    )
    write(plan, state.underflow_rates, subnormal)
    write(plan, state.zero_rates, zero)


def learn_from_overflow(state, plan, reached, step) -> None:
    """On a skipped step: every component the overflow reached backs off; where
    it started (reached, and nothing downstream was) the measured scales gain
    headroom and the other measured ones rise to at least one step of it
    (`policies.after_overflow`); telemetry notes the origin."""
    scales = policies.power_of_two_floor(
        tf.where(reached, plan.scales * policies.BACKOFF, plan.scales)
    )
    assign_scales(state, plan, scales)
    reached_below = tf.linalg.matvec(plan.downstream_matrix(), tf.cast(reached, tf.float32)) > 0
    origin = tf.logical_and(reached, tf.logical_not(reached_below))
    measured = per_component(plan, state.measured) > 0
    headroom = policies.after_overflow(
        headroom_of(state, plan),
        reached=tf.logical_and(reached, measured),
        origin=tf.logical_and(origin, measured),
        step=step,
        measured=measured,
    )
    write(plan, state.headroom, headroom.binades)
    write(plan, state.headroom_since, headroom.since)
    counts = per_component(plan, state.overflow_counts)
    write(plan, state.overflow_counts, counts + tf.cast(origin, counts.dtype))
    last = per_component(plan, state.last_overflow_step)
    write(plan, state.last_overflow_step, tf.where(origin, tf.fill(tf.shape(last), step), last))


def _entries_of(plan) -> tuple[list[list[int]], list[int]]:
    """`([entry], component)` pairs: every entry of `plan`'s components, and whose it is."""
    pairs = [([entry], i) for i, c in enumerate(plan.components) for entry in c.entries()]
    return [p[0] for p in pairs], [p[1] for p in pairs]
