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


NAMED = {"no_crossing_reductions": without_crossing_reductions}
"""The ablations a command can name."""


def named(name: str) -> contextlib.AbstractContextManager:
    """The ablation called `name` (of `NAMED`), or nothing for ""."""
    if not name:
        return contextlib.nullcontext()
    if name not in NAMED:
        raise ValueError(f"Unknown ablation {name!r}; known: {', '.join(NAMED)}.")
    return NAMED[name]()
