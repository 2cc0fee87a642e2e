"""The phases of `AdaptiveLossScaleOptimizer.apply` in a traced step, in order.

`run` calls them one after the other; each takes what the earlier ones
returned:

1. `group_by_component`: the gradients by scale component, each one's largest
   magnitude (which says whether it is finite, and is the statistic a
   measuring step reads), and each one's component (the division by its
   scale runs where the step is applied);
2. `check_finite`: whether every gradient is finite on every replica, which
   components an overflow reached, and whether the loss was finite on every
   replica (a skipped step says which of the two it was);
3. `apply_or_skip`: the inner optimizer applies, or the step is skipped and
   the reached components learn from the overflow;
4. `measure_and_choose` (measuring steps): the statistics, the policy's next
   scales, what was measured, and how many steps until the next measurement
   (`next_period`);
5. `count_until_measuring`: when the boundaries measure next.

`measure_only` runs phases 1, 2 and 4 alone (`keras_als.calibrate`);
`unscale_each` is `AdaptiveLossScaleOptimizer.unscale`.

Each phase reads and writes the optimizer's state through `state`, its
`_state.ScaleState` (never the optimizer itself). What the phases write
per scale is in `_scale_state`; applying or skipping, in `_skip`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import keras
import tensorflow as tf

from keras_als import policies
from keras_als._keras_private import overwrites_with_gradient
from keras_als.step import _crossings, _forward_state, _scale_state, _skip, _statistics
from keras_als.step._layer_call import owner_of

PLANNED_GROWTH = 3.0
"""Binades of gradient growth, at the rate last measured, that a measuring
period may let pass: half of `policies.MaxSafe`'s default margin."""


def run(state, plan, grads: list, variables: list) -> None:
    """Applies one step's gradients of `plan`'s scaled loss, in the phases above."""
    gradients = group_by_component(plan, grads, variables, state.inner_optimizer)
    finite, reached, loss_finite = check_finite(plan, gradients.weight_amax)
    step = _skip.step_number(state)
    updated = state.iterations > 0  # before this step's update
    apply_or_skip(state, plan, (finite, loss_finite), reached, gradients.unscaled, variables, step)
    if not plan.built:
        return
    measuring = finite if plan.measuring is None else tf.logical_and(plan.measuring, finite)
    period = measure_and_choose(state, plan, gradients, measuring, finite, step, updated)
    if plan.measuring is not None:
        count_until_measuring(state, finite, measuring, period)


def measure_only(state, plan, grads: list, variables: list) -> None:
    """Phases 1, 2 and 4 without 3 and 5: measures `plan`'s gradients and lets
    the policy choose the scales, applying nothing and counting no step
    (`keras_als.calibrate`). Where a gradient is not finite nothing changes."""
    gradients = group_by_component(plan, grads, variables, state.inner_optimizer)
    finite, _, _ = check_finite(plan, gradients.weight_amax)
    step = _skip.step_number(state)
    updated = state.iterations > 0
    measure_and_choose(state, plan, gradients, finite, finite, step, updated)


class Gradients(NamedTuple):
    """A step's gradients, grouped by scale component (see `group_by_component`)."""

    weight_grads: list  # per component, its weight gradients (at its scale)
    float16: list  # per component, for each of them, whether computed in float16
    weight_amax: _statistics.WeightAmax  # each one's largest magnitude (inf: not finite)
    in_order: list  # every gradient (at its scale), in variable order
    components: list  # for each, its component's index (None: applied as it is)
    each_scale: tuple  # each component's scale, read at a runtime index (`_indices`)

    def unscaled(self) -> list:
        """Every gradient divided by its component's scale, in variable order.

        Called inside the branch that applies them: XLA fuses each multiply by
        the reciprocal of the scale, read through a runtime index, into the
        update of each variable, one kernel for the variables of one shape as
        in Keras's optimizer (XLA copies a multiply into every kernel that
        reads it, where it writes a division's result out once: `_boundary`).
        Computed before the branch, each would be a kernel of its own, and the
        step slower. One reciprocal per component, shared by its gradients.
        """
        one, reciprocals = tf.constant(1.0), {}
        for i in self.components:
            if i is not None and i not in reciprocals:
                reciprocals[i] = one / self.each_scale[i]
        return [
            g if i is None else unscale(g, reciprocals[i])
            for g, i in zip(self.in_order, self.components)
        ]


def group_by_component(plan, grads, variables, inner_optimizer) -> Gradients:
    """Phase 1: groups the gradients by component, takes each one's largest
    magnitude, and pairs each with its component (`Gradients.unscaled`
    divides them by its scale). A variable `inner_optimizer` overwrites with
    its gradient (`overwrites_with_gradient`) is applied as it is.

    One reduction per gradient, over its own shape; a measuring step reads
    the same values, so no gradient enters the measuring branch. Flattened
    first and joined into one vector per component, the same reductions make
    a compiled step slower (`python -m benchmarks.suite.cost --models
    transformer --instances 3`).
    """
    weight_grads = [[] for _ in plan.components]
    float16 = [[] for _ in plan.components]
    components = []
    for g, v in zip(grads, variables):
        if g is None or overwrites_with_gradient(inner_optimizer, v):
            components.append(None)
            continue
        i = plan.index_of(v)
        weight_grads[i].append(g)
        float16[i].append(_computed_in_float16(v))
        components.append(i)
    weight_amax = _statistics.WeightAmax.of(weight_grads)
    return Gradients(weight_grads, float16, weight_amax, list(grads), components, plan.each_scale)


def check_finite(plan, weight_amax: _statistics.WeightAmax) -> tuple[tf.Tensor, ...]:
    """Phase 2: `(finite, reached, loss_finite)`: whether every gradient is
    finite on every replica, which components an overflow reached, and
    whether the loss was finite on every replica.

    Non-finite weight gradients mark the components an overflow reached: where
    it started and every component upstream of it. On measuring steps the
    gradients entering each component's wrapped layers are reduced too (else
    they read 0): a non-finite one counts. With a loss that is not finite, the
    forward pass (the data, or a layer's float16 output) is to blame, not the
    scales: it reaches none, and the skipped step is marked so for the
    telemetry. The loss's flag travels in the gradients' one gather across
    replicas, as one more element.
    """
    crossed = {}
    if plan.crossings is not None:
        plan.crossings.complete()  # the boundaries' gradients that still wait, and the bounds
        crossed = plan.crossings.reduced
    inside = [
        (i, crossed[id(b)].amax)
        for i, c in enumerate(plan.components)
        for b in c.inside
        if id(b) in crossed
    ]
    not_finite = _not_finite_per_component(weight_amax.extended(inside), len(plan.components))
    loss_not_finite = tf.reshape(tf.logical_not(plan.loss_finite), [1])
    anywhere = _statistics.reached_on_any_replica(tf.concat([not_finite, loss_not_finite], 0))
    finite = tf.logical_not(tf.reduce_any(anywhere[:-1]))
    reached = _statistics.reached_on_any_replica(tf.logical_and(not_finite, plan.loss_finite))
    return finite, reached, tf.logical_not(anywhere[-1])


def apply_or_skip(state, plan, finite, reached, unscaled, variables, step) -> None:
    """Phase 3: applies the unscaled gradients if `finite` (a pair: the
    gradients' flag and the loss's); else skips the step, changing no
    weight, inner optimizer slot or forward state, and learns from the
    overflow."""
    finite, loss_finite = finite

    def learn():
        _scale_state.learn_from_overflow(state, plan, reached, step)

    _skip.apply_if_finite(
        state,
        finite,
        unscaled,
        variables,
        step,
        on_skip=learn if plan.built else None,
        loss_finite=loss_finite,
    )
    _forward_state.restore_unless(finite)


def measure_and_choose(state, plan, gradients, measuring, finite, step, updated) -> tf.Tensor:
    """Phase 4: where `measuring`, measures this step's statistics, asks the
    policy for the next scales and records what was measured. Returns the
    steps until the next measurement (`next_period`; read only where
    `measuring`): a measurement before the first update (`updated` false)
    raises no scale, and the next step measures again, one update later."""

    crossed = _crossings.Crossed.of(plan)  # read by the branch as two tensors

    def measured():
        statistics = _statistics.measure(
            plan, gradients.weight_amax, gradients.weight_grads, crossed
        )
        return _statistics.agree_across_replicas(statistics)

    def update(statistics):
        proposed, rows = _scale_state.choose_scales(state, plan, statistics, finite, step, updated)
        rows.update(_scale_state.record_measurement(state, plan, statistics, gradients))
        _scale_state.write(plan, state, rows)
        elapsed = state.counter("steps_since_measured") + 1
        period = next_period(plan.scales, proposed, elapsed, state.measure_every_n_steps)
        return tf.where(updated, period, tf.ones_like(period))

    if _statistics.several_replicas():
        # Replicas can neither gather nor assign inside a cond: only the
        # reductions are conditional, the rest keeps every scale when not measuring.
        statistics = _statistics.measure_if(
            measuring, plan, gradients.weight_amax, gradients.weight_grads, crossed
        )
        return update(_statistics.agree_across_replicas(statistics))
    # Steps that do not measure keep every scale, at the cost of one branch.
    nothing = tf.zeros([], tf.int32)  # the dtype of next_period's steps
    return tf.cond(measuring, lambda: update(measured()), lambda: nothing)


def next_period(old: tf.Tensor, new: tf.Tensor, elapsed: tf.Tensor, longest: int) -> tf.Tensor:
    """Steps from this measurement to the next, from how far it moved the scales.

    `elapsed` steps passed since the last measurement, and the scales went
    from `old` to `new` (powers of two). A scale that fell by `2**b` says its
    gradients grew about `b / elapsed` binades per step; the next period is
    the longest in which growth at that rate stays within `PLANNED_GROWTH`
    (half of `MaxSafe`'s margin of 6 binades), and at most twice `elapsed`:

        period = min(2 * elapsed, floor(PLANNED_GROWTH * elapsed / b))

    for the largest fall `b` of any scale; 1 step where a scale rose by
    `BLIND_GROWTH` or more (a guess for gradients that were all zero, checked
    on the next step); never more than `longest` (`measure_every_n_steps`).
    So settled scales are measured after 1, 2, 4, 8, then every 16 steps; a
    model whose gradients keep growing (VGG16 under Adam, which has no
    normalization) is measured as often as its growth needs; and a scale that
    only swings with the batch (ConvNeXt's last stages at 32x32, 16-fold from
    one batch to the next) shortens the period in proportion, not to 1 step.

    Example:

    >>> import tensorflow as tf
    >>> int(next_period(tf.constant([4.0, 8.0]), tf.constant([4.0, 2.0]), tf.constant(6), 16))
    9
    """
    old = tf.convert_to_tensor(old, tf.float32)
    new = tf.convert_to_tensor(new, tf.float32)
    elapsed = tf.convert_to_tensor(elapsed)
    fell = tf.round(tf.math.log(tf.reduce_max(old / new)) / math.log(2.0))  # binades, exact
    # A fall of at most 1 binade allows 3 * elapsed, more than twice.
    in_proportion = tf.cast(
        tf.floor(PLANNED_GROWTH * tf.cast(elapsed, tf.float32) / tf.maximum(fell, 1.0)),
        elapsed.dtype,
    )
    period = tf.minimum(2 * elapsed, in_proportion)
    guessed = tf.reduce_any(new / old >= policies.BLIND_GROWTH)
    period = tf.where(guessed, tf.ones_like(period), period)
    return tf.clip_by_value(period, 1, longest)


def count_until_measuring(state, finite, measured, period) -> None:
    """Phase 5: the next measurement comes on the next finite step after a
    skipped step, else `period` steps after a measuring step (`next_period`);
    `steps_since_measured` counts the finite steps since the last measurement
    or skipped step."""
    until = state.counter("steps_until_measuring")
    since = state.counter("steps_since_measured")
    zero = tf.zeros_like(until)
    until = tf.where(finite, tf.where(measured, tf.cast(period, until.dtype) - 1, until - 1), zero)
    since = tf.where(tf.logical_and(finite, tf.logical_not(measured)), since + 1, zero)
    values = {"steps_since_measured": since, "steps_until_measuring": until}
    state.assign(new_counters=state.counters_with(state.counter_masks(), values=values))


def unscale(gradient, reciprocal):
    """`gradient` times `reciprocal` (1 / its scale) in float32, cast back to its dtype.

    Scales are powers of two, so the reciprocal is exact and the product
    bit-identical to the quotient.
    """
    if isinstance(gradient, tf.IndexedSlices):
        values = unscale(gradient.values, reciprocal)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    if gradient.dtype == tf.float32:
        return gradient * reciprocal
    return tf.cast(tf.cast(gradient, tf.float32) * reciprocal, gradient.dtype)


def unscale_each(state, plan, grads: list, variables: list) -> list:
    """`AdaptiveLossScaleOptimizer.unscale`: each gradient divided by its
    component's scale in `plan`, or, without a plan (an eager step), by
    Keras's one dynamic scale (None stays None)."""
    if plan is None:
        scale = state.dynamic_scale if state.built else state.initial_scale
        reciprocal = 1.0 / tf.cast(scale, tf.float32)
        return [None if g is None else unscale(g, reciprocal) for g in grads]
    return [
        None if g is None else unscale(g, plan.reciprocal_of(v)) for g, v in zip(grads, variables)
    ]


def _not_finite_per_component(amax: _statistics.WeightAmax, size: int) -> tf.Tensor:
    """Per component (`size` of them), True if any of its largest magnitudes
    in `amax` is not finite.

    One check of all of them at once, not one small one per component; a
    component with nothing to check is finite.
    """
    if not amax.components:
        return tf.zeros([size], tf.bool)
    not_finite = tf.cast(tf.logical_not(tf.math.is_finite(amax.values)), tf.int32)
    return tf.math.unsorted_segment_max(not_finite, list(amax.components), size) > 0


def _computed_in_float16(variable) -> bool:
    """Whether the layer that owns `variable` computes in float16 (else the global policy)."""
    owner = owner_of(variable)
    dtype = owner.layer.compute_dtype if owner is not None else None
    return (dtype or keras.config.dtype_policy().compute_dtype) == "float16"
