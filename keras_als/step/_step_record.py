"""The one hand-off of a traced training step: what the forward pass and
`scale_loss` leave for the backward pass and `apply`.

A training step is three calls the user (or `model.fit`) makes in one traced
function: the forward pass, `optimizer.scale_loss(loss)` then
`tape.gradient`, and `optimizer.apply(grads)`. What passes between them
outside their arguments is one `StepRecord`, and only through this module:

    forward pass   _layer_call           adds boundaries and snapshots
    scale_loss     make_plan             reads the boundaries, adds the plan
    apply                                reads the plan, takes the snapshots

The record is frozen: each call replaces it with a new one. It is kept on the
traced graph itself, one per thread (under a `tf.distribute` strategy each
replica traces in a thread of its own), so it lives and dies with the graph
and re-traces and replicas never mix. Outside a traced function nothing is
recorded.
"""

from __future__ import annotations

import threading
import weakref
from typing import NamedTuple

import tensorflow as tf

_ATTRIBUTE = "_keras_als_step_records"
"""Name of the graph attribute holding `{thread id: StepRecord}`."""


class StepRecord(NamedTuple):
    """What one traced step has recorded so far (per graph and thread).

    Attributes:
        boundaries: The `_boundary.Boundary` objects the forward pass inserted,
            in order.
        snapshots: `(variable, value before the step)` for every non-trainable
            variable a wrapped layer updates forward (BatchNormalization's
            moving statistics), earliest first: `apply` restores them when it
            skips the step.
        plans: `(weak reference to an optimizer, its _plan.Plan)`, one per
            optimizer whose `scale_loss` ran in this step.
        measures: Whether the step measures whatever the optimizer's period
            (`measure_this_step`: `keras_als.calibrate`'s pass).
        entered: Weak references to the outermost layers whose calls placed
            the boundaries (the model `fit` called), each once, in order
            (`_early_build`).
    """

    boundaries: tuple = ()
    snapshots: tuple = ()
    plans: tuple = ()
    measures: bool = False
    entered: tuple = ()

    def plan_for(self, optimizer):
        """The plan `optimizer.scale_loss` made in this step, or None."""
        for reference, plan in self.plans:
            if reference() is optimizer:
                return plan
        return None


def _records(graph) -> dict:
    records = getattr(graph, _ATTRIBUTE, None)
    if records is None:
        records = {}
        setattr(graph, _ATTRIBUTE, records)
    return records


def read(graph=None) -> StepRecord:
    """The record of `graph` (default: the graph being traced) in this thread."""
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    return getattr(graph, _ATTRIBUTE, {}).get(threading.get_ident(), StepRecord())


def _write(record: StepRecord, graph=None) -> None:
    graph = graph if graph is not None else tf.compat.v1.get_default_graph()
    _records(graph)[threading.get_ident()] = record


def add_boundary(boundary, entered=None) -> None:
    """Records a boundary the forward pass inserted into the graph traced now,
    and `entered`, the outermost layer whose call placed it (if any)."""
    record = read()
    record = record._replace(boundaries=record.boundaries + (boundary,))
    if entered is not None and all(seen() is not entered for seen in record.entered):
        record = record._replace(entered=record.entered + (weakref.ref(entered),))
    _write(record)


def add_snapshots(snapshots) -> None:
    """Records forward-state values to restore if the step is skipped."""
    if snapshots:
        record = read()
        _write(record._replace(snapshots=record.snapshots + tuple(snapshots)))


def plan_now(optimizer):
    """The plan `optimizer.scale_loss` made in the step traced now, or None."""
    return read().plan_for(optimizer) if tf.inside_function() else None


def planned_elsewhere(optimizer) -> bool:
    """True if `optimizer.scale_loss` last ran in another traced function than this one."""
    planned_in = getattr(optimizer, "_keras_als_planned_in", None)
    graph = planned_in() if planned_in is not None else None
    return graph is not None and graph is not tf.compat.v1.get_default_graph()


def add_plan(optimizer, plan) -> None:
    """Records `optimizer`'s plan for the step traced in `plan.graph`."""
    optimizer._keras_als_planned_in = weakref.ref(plan.graph)
    record = read(plan.graph)
    others = tuple((r, p) for r, p in record.plans if r() is not optimizer and r() is not None)
    _write(record._replace(plans=others + ((weakref.ref(optimizer), plan),)), plan.graph)


def measure_this_step() -> None:
    """Makes the step traced now measure its gradients, whatever the period of
    the optimizer whose `scale_loss` it calls next (`keras_als.calibrate`)."""
    _write(read()._replace(measures=True))


def take_snapshots() -> tuple:
    """The snapshots of the step traced now, removed from its record (restore once)."""
    record = read()
    if record.snapshots:
        _write(record._replace(snapshots=()))
    return record.snapshots
