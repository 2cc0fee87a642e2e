"""Forward-pass state updates, undone when the optimizer skips the step.

A wrapped layer may update non-trainable state as it runs forward (the moving
statistics of BatchNormalization). When the optimizer skips a step, that batch
must leave no trace at all, so `AdaptiveScaled` snapshots each such variable
before the call into the step's record (`_step_record`), and
`AdaptiveLossScaleOptimizer.apply` restores them unless the step is applied.
Outside a traced function nothing is recorded.
"""

from __future__ import annotations

import tensorflow as tf

from keras_als import _step_record


def snapshot(variables) -> None:
    """Records the values of `variables` before a forward pass that may update them."""
    if tf.inside_function():
        _step_record.add_snapshots([(v, tf.identity(v.value)) for v in variables])


def restore_unless(applied: tf.Tensor) -> None:
    """Puts every recorded variable back to its value before the step, unless `applied`."""
    restored = set()
    for variable, before in _step_record.take_snapshots():  # earliest snapshot first
        if id(variable) in restored:
            continue
        restored.add(id(variable))
        variable.assign(tf.where(applied, variable.value, before))
