"""Ablations of keras_als's traced step, for costing its parts (benchmarks only).

Each is a context manager: steps traced inside it leave one part out, and
everything is put back on exit. They replace private keras_als names, so they
belong here and nowhere in the library.
"""

from __future__ import annotations

import contextlib


class _NoReductions:
    """Stands in for `keras_als._crossings.Crossings` and reduces nothing (ablation only:
    scales are then chosen from weight gradients alone)."""

    def __init__(self, graph, measuring, count_zeros):
        self.reduced = {}

    def arrived(self, boundary, gradients):
        pass

    def finish(self):
        pass


ONE_SCALE = 2.0**10
"""Every scale of the `no_boundary_multiplies` ablation (within Keras's
dynamic range for these models: no step overflows)."""


def _not_multiplied(gradient, ratio):
    """Stands in for `keras_als._boundary.multiply` where every ratio is 1
    (all scales `ONE_SCALE`): the boundaries' multiplies, left out."""
    return gradient


@contextlib.contextmanager
def without_crossing_reductions():
    """Steps traced inside leave out the reductions of the gradients crossing
    the boundaries (ablation only: scales then come from weight gradients alone).

    Example:
        >>> with without_crossing_reductions():
        ...     pass  # model.train_on_batch(x, y) traces its step without them
    """
    from keras_als import _crossings

    original = _crossings.Crossings
    _crossings.Crossings = _NoReductions
    try:
        yield
    finally:
        _crossings.Crossings = original


@contextlib.contextmanager
def without_boundary_multiplies():
    """Steps traced inside leave the boundaries' multiplies out (right only
    where every ratio is 1: every scale `ONE_SCALE`)."""
    from keras_als import _boundary

    original = _boundary.multiply
    _boundary.multiply = _not_multiplied
    try:
        yield
    finally:
        _boundary.multiply = original


@contextlib.contextmanager
def crossings_reduced_last():
    """Steps traced inside reduce every crossing gradient in one branch after
    backprop, where keras_als reduces them in groups of about
    `_crossings.WAITING_BYTES` as they arrive (ablation only: the scales are
    the same, the schedule XLA finds is not)."""
    from keras_als import _crossings

    original = _crossings.WAITING_BYTES
    _crossings.WAITING_BYTES = float("inf")
    try:
        yield
    finally:
        _crossings.WAITING_BYTES = original


def _reduced_early(crossings_class, lone_only: bool):
    """A `Crossings` whose branch, when a boundary's arrival completes a group
    (`lone_only`: a group of that boundary's gradients alone), hands that
    boundary an exact zero computed from the branch's result (a largest
    magnitude, >= 0 or inf and never NaN: its minimum with 0 is 0), added to
    its ratio: the gradient cannot flow on before the branch has run."""
    import tensorflow as tf

    class ReducedEarly(crossings_class):
        def arrived(self, boundary, gradients):
            before, alone = len(self.reduced), not self._waiting
            super().arrived(boundary, gradients)
            if len(self.reduced) > before and (alone or not lone_only):
                zero = tf.minimum(self.reduced[id(boundary)].amax, 0.0)
                boundary.ratio = zero + (1.0 if boundary.ratio is None else boundary.ratio)

    return ReducedEarly


@contextlib.contextmanager
def crossings_reduced_early(lone_only: bool = False):
    """Steps traced inside make the gradient whose arrival completes a group of
    crossing gradients (`lone_only`: one that fills a group alone) wait for
    that group's branch (`_reduced_early`), so XLA must run the branch as soon
    as its group is complete, not where its results are read after backprop
    (ablation only: same scales, same gradients)."""
    from keras_als import _crossings

    original = _crossings.Crossings
    _crossings.Crossings = _reduced_early(original, lone_only)
    try:
        yield
    finally:
        _crossings.Crossings = original


NAMED = {
    "no_crossing_reductions": without_crossing_reductions,
    "crossings_reduced_last": crossings_reduced_last,
    "crossings_reduced_early": crossings_reduced_early,
    "lone_crossings_reduced_early": lambda: crossings_reduced_early(lone_only=True),
}
"""The ablations a command can name."""


def named(name: str) -> contextlib.AbstractContextManager:
    """The ablation called `name` (of `NAMED`), or nothing for ""."""
    if not name:
        return contextlib.nullcontext()
    if name not in NAMED:
        raise ValueError(f"Unknown ablation {name!r}; known: {', '.join(NAMED)}.")
    return NAMED[name]()
