"""Applying a step's gradients, or skipping the step.

A skipped step changes no weight and no slot of the inner optimizer; it
counts in the optimizer's counters (`skipped_steps`, `skipped_in_a_row` and
the recent skips window, for the telemetry) and runs `on_skip`. Its entry
of the window says why it was skipped: `SKIPPED` for a gradient that was not
finite, `SKIPPED_LOSS_NOT_FINITE` where the loss itself was not (the forward
pass). The mark is written only in the branch that skips: an applied step
pays nothing for it.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from keras_als._keras_private import strategy_supports_no_merge_call

SKIPPED = 1.0
"""The recent skips window's entry for a step skipped for its gradients (0: applied)."""
SKIPPED_LOSS_NOT_FINITE = 2.0
"""The entry for a skipped step whose loss was not finite. The window's
layout is unchanged: checkpoints written before this mark existed load, and
their skipped steps read as `SKIPPED`."""


def step_number(state) -> tf.Tensor:
    """This step's number (applied and skipped steps before it), as float32."""
    skipped = tf.cast(state.skipped_steps, state.iterations.dtype)
    return tf.cast(state.iterations + skipped, "float32")


def apply_if_finite(
    state,
    finite,
    gradients: Callable[[], list],
    variables,
    step,
    on_skip: Callable[[], None] | None = None,
    loss_finite: tf.Tensor | None = None,
) -> None:
    """Applies `gradients()` with `state.inner_optimizer` if `finite`, else skips the step.

    A skipped step whose `loss_finite` is false is marked
    `SKIPPED_LOSS_NOT_FINITE` in the recent skips window (None: the loss is
    not known, `SKIPPED`).

    `gradients` is called inside the branch that applies them, so that XLA
    fuses what computes them (the unscaling) into the update.

    Both branches hold elementwise updates only (the counters are written
    through masks made before the conditional, not by a scatter), and
    `on_skip` runs in a conditional of its own after them: XLA can then
    compile the apply-or-skip conditional into selects over the elementwise
    update, as it does for Keras's LossScaleOptimizer, which runs faster on a
    CPU than a conditional (a gather, scatter or matrix product in a branch,
    as learning from an overflow has, keeps the conditional).
    """
    masks = state.counter_masks(step)

    def applied():
        zero = ("skipped_in_a_row", "window")
        state.assign(new_counters=state.counters_with(masks, zero=zero))

    def skip_step(loss_finite=loss_finite):
        counted = ("skipped_steps", "skipped_in_a_row")
        mark = SKIPPED
        if loss_finite is not None:
            mark = tf.where(loss_finite, SKIPPED, SKIPPED_LOSS_NOT_FINITE)
        counters = state.counters_with(masks, increment=counted, values={"window": mark})
        state.assign(new_counters=counters)

    def apply_step():
        state.inner_optimizer.apply(gradients(), trainable_variables=variables)
        applied()

    if strategy_supports_no_merge_call():
        keras.ops.cond(finite, apply_step, skip_step)
        if on_skip is not None:
            keras.ops.cond(finite, lambda: None, on_skip)
        return

    # The inner optimizer all-reduces through merge_call, which a cond in
    # replica context cannot contain: decide in cross-replica context.
    def decide(distribution, finite, loss_finite, grads):
        finite = distribution.experimental_local_results(finite)[0]
        if loss_finite is not None:
            loss_finite = distribution.experimental_local_results(loss_finite)[0]

        def apply_everywhere():
            distribution.extended.call_for_each_replica(
                lambda g: state.inner_optimizer.apply(g, trainable_variables=variables),
                args=(grads,),
            )
            applied()

        keras.ops.cond(finite, apply_everywhere, lambda: skip_step(loss_finite))
        if on_skip is not None:
            keras.ops.cond(finite, lambda: None, on_skip)

    tf.distribute.get_replica_context().merge_call(decide, args=(finite, loss_finite, gradients()))
