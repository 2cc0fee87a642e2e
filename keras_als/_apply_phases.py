"""The phases of `AdaptiveLossScaleOptimizer.apply` in a traced step, in order.

`run` calls them one after the other; each takes what the earlier ones
returned:

1. `group_and_unscale`: the gradients by scale component, whether each
   component's are finite, and each one's reciprocal scale (the division runs
   where the step is applied);
2. `check_finite`: whether every gradient is finite on every replica, and
   which components an overflow reached;
3. `apply_or_skip`: the inner optimizer applies, or the step is skipped and
   the reached components learn from the overflow;
4. `measure_and_choose` (measuring steps): the statistics, the policy's next
   scales, what was measured;
5. `count_until_measuring`: when the boundaries measure next.

What the phases write into the optimizer's state per scale is in
`_scale_state`; applying or skipping, in `_skip`.
"""

from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf

from keras_als import _forward_state, _scale_state, _skip, _statistics
from keras_als.wrapper import owner_of

SETTLING = 2.0**4
"""A scale that moved by this factor or more is still settling: measure again."""


def run(optimizer, plan, grads: list, variables: list) -> None:
    """Applies one step's gradients of `plan`'s scaled loss, in the phases above."""
    gradients = group_and_unscale(plan, grads, variables, optimizer)
    finite, reached = check_finite(plan, gradients.weight_finite)
    step = _skip.step_number(optimizer)
    updated = optimizer.iterations > 0  # before this step's update
    apply_or_skip(optimizer, plan, finite, reached, gradients.unscaled, variables, step)
    if not plan.built:
        return
    measuring = finite if plan.measuring is None else tf.logical_and(plan.measuring, finite)
    unsettled = measure_and_choose(optimizer, plan, gradients, measuring, finite, step, updated)
    if plan.measuring is not None:
        count_until_measuring(optimizer, finite, unsettled)


class Gradients(NamedTuple):
    """A step's gradients, grouped by scale component (see `group_and_unscale`)."""

    weight_grads: list  # per component, its weight gradients (at its scale)
    float16: list  # per component, for each of them, whether computed in float16
    weight_finite: list  # per component, for each of them, whether all of it is finite
    in_order: list  # every gradient (at its scale), in variable order
    reciprocals: list  # for each, 1 / its component's scale (None: applied as it is)

    def unscaled(self) -> list:
        """Every gradient divided by its component's scale, in variable order.

        Called inside the branch that applies them: XLA fuses each division
        into the update of its variable, as for Keras's optimizer; computed
        before the branch, each would be a kernel of its own.
        """
        return [g if r is None else unscale(g, r) for g, r in zip(self.in_order, self.reciprocals)]


def group_and_unscale(plan, grads, variables, optimizer) -> Gradients:
    """Phase 1: groups the gradients by component, checks each is finite, and
    pairs each with its component's reciprocal scale (`Gradients.unscaled`
    divides them)."""
    weight_grads = [[] for _ in plan.components]
    float16 = [[] for _ in plan.components]
    reciprocals = []
    for g, v in zip(grads, variables):
        if g is None or optimizer._overwrite_variable_with_gradient(v):
            reciprocals.append(None)
            continue
        i = plan.index_of(v)
        weight_grads[i].append(g)
        float16[i].append(_computed_in_float16(v))
        reciprocals.append(plan.each_reciprocal[i])
    weight_finite = [[_statistics.all_finite(*group)] if group else [] for group in weight_grads]
    return Gradients(weight_grads, float16, weight_finite, list(grads), reciprocals)


def check_finite(plan, weight_finite) -> tuple[tf.Tensor, tf.Tensor]:
    """Phase 2: whether every gradient is finite on every replica, and which
    components an overflow reached.

    Non-finite weight gradients mark the components an overflow reached: where
    it started and every component upstream of it. On measuring steps the
    gradients entering each component's wrapped layers are reduced too (else
    they read 0): a non-finite one counts. With a loss that is not finite, the
    forward pass (the data) is to blame, not the scales: it reaches none.
    """
    crossed = {}
    if plan.crossings is not None:
        plan.crossings.finish()  # the boundaries' gradients that still wait
        crossed = plan.crossings.reduced
    finite_each = [
        group + [tf.math.is_finite(crossed[id(b)].amax) for b in c.inside if id(b) in crossed]
        for group, c in zip(weight_finite, plan.components)
    ]
    not_finite = _not_finite_per_component(finite_each)
    finite = tf.logical_not(tf.reduce_any(_statistics.reached_on_any_replica(not_finite)))
    reached = _statistics.reached_on_any_replica(tf.logical_and(not_finite, plan.loss_finite))
    return finite, reached


def apply_or_skip(optimizer, plan, finite, reached, unscaled, variables, step) -> None:
    """Phase 3: applies the unscaled gradients if `finite`; else skips the step,
    changing no weight, inner optimizer slot or forward state, and learns from
    the overflow."""

    def learn():
        _scale_state.learn_from_overflow(optimizer, plan, reached, step)

    _skip.apply_if_finite(
        optimizer, finite, unscaled, variables, step, on_skip=learn if plan.built else None
    )
    _forward_state.restore_unless(finite)


def measure_and_choose(optimizer, plan, gradients, measuring, finite, step, updated) -> tf.Tensor:
    """Phase 4: where `measuring`, measures this step's statistics, asks the
    policy for the next scales and records what was measured. Returns whether a
    scale moved far, or the policy asked it to (it is still settling): a
    measurement before the first update (`updated` false) raises no scale."""

    def measured():
        statistics = _statistics.measure(plan, gradients.weight_grads)
        return _statistics.agree_across_replicas(statistics)

    def update(statistics):
        proposed = _scale_state.choose_scales(optimizer, plan, statistics, finite, step, updated)
        _scale_state.record_measurement(optimizer, plan, statistics, gradients)
        return _moved_far(plan.scales, proposed)

    if _statistics.several_replicas():
        # Replicas can neither gather nor assign inside a cond: only the
        # reductions are conditional, the rest keeps every scale when not measuring.
        statistics = _statistics.measure_if(measuring, plan, gradients.weight_grads)
        return update(_statistics.agree_across_replicas(statistics))
    # Steps that do not measure keep every scale, at the cost of one branch.
    return tf.cond(measuring, lambda: update(measured()), lambda: tf.constant(False))


def count_until_measuring(optimizer, finite, unsettled) -> None:
    """Phase 5: measures again on the next step after a skipped step or while
    scales move far (they are still settling); else in `measure_every_n_steps`."""
    counted = (optimizer.steps_since_measured + 1) % optimizer.measure_every_n_steps
    again = tf.logical_or(tf.logical_not(finite), unsettled)
    since = tf.where(again, tf.zeros_like(counted), counted)
    masks = _scale_state.counter_masks(optimizer)
    values = {"steps_since_measured": since}
    counters = _scale_state.counters_with(optimizer, masks, values=values)
    optimizer.counters.assign(counters)


def unscale(gradient, reciprocal):
    """`gradient` times `reciprocal` (1 / its scale) in float32, cast back to its dtype.

    Scales are powers of two, so the reciprocal is exact and the product
    bit-identical to the quotient; the plan computes the reciprocals once per
    step for all scales (`Plan.each_reciprocal`), not one per gradient.
    """
    if isinstance(gradient, tf.IndexedSlices):
        values = unscale(gradient.values, reciprocal)
        return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)
    if gradient.dtype == tf.float32:
        return gradient * reciprocal
    return tf.cast(tf.cast(gradient, tf.float32) * reciprocal, gradient.dtype)


def _not_finite_per_component(finite_each: list[list[tf.Tensor]]) -> tf.Tensor:
    """Per component, True if any of its checks (`finite_each[i]`, scalar bools) is False.

    One reduction of all checks at once, not one small one per component; a
    component with no checks is finite.
    """
    components = [i for i, group in enumerate(finite_each) for _ in group]
    if not components:
        return tf.zeros([len(finite_each)], tf.bool)
    finite = tf.stack([check for group in finite_each for check in group])
    not_finite = tf.cast(tf.logical_not(finite), tf.int32)
    return tf.math.unsorted_segment_max(not_finite, components, len(finite_each)) > 0


def _computed_in_float16(variable) -> bool:
    """Whether the layer that owns `variable` computes in float16 (else the global policy)."""
    owner = owner_of(variable)
    dtype = owner.layer.compute_dtype if owner is not None else None
    return (dtype or keras.config.dtype_policy().compute_dtype) == "float16"


def _moved_far(old: tf.Tensor, new: tf.Tensor) -> tf.Tensor:
    """True if some scale changed by a factor of `SETTLING` or more."""
    ratio = new / old
    return tf.reduce_any(tf.logical_or(ratio >= SETTLING, ratio <= 1.0 / SETTLING))
