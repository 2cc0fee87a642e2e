"""Forward-pass state updates, undone when the optimizer skips the step.

A wrapped layer may update non-trainable state as it runs forward (the moving
statistics of BatchNormalization). When the optimizer skips a step, that batch
must leave no trace at all, so `AdaptiveScaled` records each such variable
with its value before the call, and `AdaptiveLossScaleOptimizer.apply`
restores them unless the step is applied. Records are kept per traced graph
and per thread (one replica traces per thread); outside a traced function
nothing is recorded.
"""

from __future__ import annotations

import threading
import weakref

import tensorflow as tf

_local = threading.local()


def _records() -> weakref.WeakKeyDictionary:
    if not hasattr(_local, "records"):
        _local.records = weakref.WeakKeyDictionary()
    return _local.records


def snapshot(variables) -> list:
    """Reads `variables` before a forward pass that may update them."""
    if not tf.inside_function():
        return []
    return [(v, tf.identity(v.value)) for v in variables]


def record(snapshots) -> None:
    """Keeps the snapshots of this forward pass for the optimizer."""
    if snapshots:
        graph = tf.compat.v1.get_default_graph()
        _records().setdefault(graph, []).extend(snapshots)


def restore_unless(applied: tf.Tensor) -> None:
    """Puts every recorded variable back to its value before the step, unless `applied`."""
    graph = tf.compat.v1.get_default_graph()
    restored = set()
    for variable, before in _records().pop(graph, []):  # earliest snapshot first
        if id(variable) in restored:
            continue
        restored.add(id(variable))
        variable.assign(tf.where(applied, variable.value, before))
