"""Forward-pass state updates, undone when the optimizer skips the step.

A scaled layer may update non-trainable state as it runs forward (the moving
statistics of BatchNormalization). When the optimizer skips a step, that batch
must leave no trace at all, so each scaled call runs inside `watch`, which
records the value before the call of every variable the call writes into the
step's record (`_step_record`); `AdaptiveLossScaleOptimizer.apply` restores
them unless the step is applied. Variables the call only reads (the frozen
kernel of a LoRA layer) are not recorded, so they cost the step nothing.
Outside a traced function nothing is recorded.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf

from keras_als._keras_private import no_autocast
from keras_als.step import _step_record

_READS = frozenset({"ReadVariableOp", "ResourceGather", "VariableShape"})
"""Operations on a variable's handle that do not write it."""


@contextlib.contextmanager
def watch(variables):
    """Records, around a forward call, the earlier value of each of `variables` it writes."""
    variables = list(variables)
    if not variables or not tf.inside_function():
        yield
        return
    graph = tf.compat.v1.get_default_graph()
    with no_autocast():
        before = [(v, tf.identity(v.value)) for v in variables]  # unused ones are pruned
    yield
    with no_autocast():
        written = _written(graph, variables)
    _step_record.add_snapshots([(v, value) for v, value in before if id(v) in written])


def _written(graph, variables) -> set[int]:
    """`id`s of `variables` whose handle an operation of `graph` uses other than to read."""
    internal = {id(external): inside for external, inside in graph.captures}
    written = set()
    for v in variables:
        handle = internal.get(id(v.handle))
        if handle is None:
            continue
        if any(op.type not in _READS for op in handle.consumers()):
            written.add(id(v))
    return written


def restore_unless(applied: tf.Tensor) -> None:
    """Puts every recorded variable back to its value before the step, unless `applied`."""
    restored = set()
    for variable, before in _step_record.take_snapshots():  # earliest snapshot first
        if id(variable) in restored:
            continue
        restored.add(id(variable))
        variable.assign(tf.where(applied, variable.value, before))
