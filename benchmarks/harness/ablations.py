"""Ablations of keras_als's traced step, for costing its parts (benchmarks only).

Each is a context manager: steps traced inside it leave one part out, and
everything is put back on exit. They replace private keras_als names, so they
belong here and nowhere in the library.
"""

from __future__ import annotations

import contextlib
import functools


class _NoReductions:
    """Stands in for `keras_als.step._crossings.Crossings` and reduces nothing (ablation only:
    scales are then chosen from weight gradients alone)."""

    def __init__(self, graph, measuring, count_zeros, bounds=None):
        self.reduced = {}

    def arrived(self, boundary, gradients):
        pass

    def finish(self):
        pass

    def complete(self):
        pass


ONE_SCALE = 2.0**10
"""Every scale of the `no_boundary_rescaling` ablation (within Keras's
dynamic range for these models: no step overflows)."""


def _not_rescaled(gradient, factor, divides):
    """Stands in for `keras_als.step._boundary.rescale` where every factor is 1
    (all scales `ONE_SCALE`): the boundaries' rescaling, left out."""
    return gradient


@contextlib.contextmanager
def _replaced(module: str, attribute: str, make):
    """Steps traced inside see `keras_als.step.<module>.<attribute>` replaced by
    `make(original)`; the original is put back on exit."""
    import importlib

    where = importlib.import_module(f"keras_als.step.{module}")
    original = getattr(where, attribute)
    setattr(where, attribute, make(original))
    try:
        yield
    finally:
        setattr(where, attribute, original)


def without_crossing_reductions() -> contextlib.AbstractContextManager:
    """Steps traced inside leave out the reductions of the gradients crossing
    the boundaries (ablation only: scales then come from weight gradients alone).

    Example:
        >>> with without_crossing_reductions():
        ...     pass  # model.train_on_batch(x, y) traces its step without them
    """
    return _replaced("_crossings", "Crossings", lambda _: _NoReductions)


def _joins_left_out(crossings_class):
    import keras

    class JoinsLeftOut(crossings_class):
        def arrived(self, boundary, gradients):
            layer = getattr(boundary.owner, "layer", boundary.owner)  # a hook's layer
            if isinstance(layer, keras.layers.Concatenate):
                return None
            return super().arrived(boundary, gradients)

    return JoinsLeftOut


def without_concatenation_reductions() -> contextlib.AbstractContextManager:
    """Steps traced inside leave out the reductions of the gradients crossing
    the boundaries of `Concatenate` layers alone, each a slice of the
    concatenation's gradient (ablation only: those components' scales then
    come from their other statistics)."""
    return _replaced("_crossings", "Crossings", _joins_left_out)


def joins_read() -> contextlib.AbstractContextManager:
    """Steps traced inside reduce the gradients crossing into joins, as every
    other boundary's, where keras_als bounds them from the reads their outputs
    feed (`keras_als.step._join_bounds`; ablation only: the scales may differ,
    never the gradients)."""
    return _replaced("_join_bounds", "rows", lambda _: lambda *_: {})


def without_boundary_rescaling() -> contextlib.AbstractContextManager:
    """Steps traced inside leave the boundaries' rescaling out, division and
    multiplication alike (right only where every divisor is 1: every scale
    `ONE_SCALE`)."""
    return _replaced("_boundary", "rescale", lambda _: _not_rescaled)


def crossings_reduced_last() -> contextlib.AbstractContextManager:
    """Steps traced inside reduce every crossing gradient in one branch after
    backprop, where keras_als reduces them in groups of about
    `_crossings.WAITING_BYTES` as they arrive (ablation only: the scales are
    the same, the schedule XLA finds is not)."""
    return _replaced("_crossings", "WAITING_BYTES", lambda _: float("inf"))


def _every_group_waits(crossings_class):
    class EveryGroupWaits(crossings_class):
        def arrived(self, boundary, gradients):
            before = len(self.reduced)
            zero = super().arrived(boundary, gradients)
            if zero is None and len(self.reduced) > before:
                zero = self.zero_after(boundary)
            return zero

    return EveryGroupWaits


def _none_waits(crossings_class):
    class NoneWaits(crossings_class):
        def arrived(self, boundary, gradients):
            super().arrived(boundary, gradients)

    return NoneWaits


def crossings_reduced_early() -> contextlib.AbstractContextManager:
    """Steps traced inside make every gradient that completes a group of
    crossing gradients wait for the group's branch, where keras_als makes only
    a gradient that fills a group alone wait (ablation only: same scales, same
    gradients, another schedule)."""
    return _replaced("_crossings", "Crossings", _every_group_waits)


def crossings_never_wait() -> contextlib.AbstractContextManager:
    """Steps traced inside make no gradient wait for its reductions: XLA runs
    each branch where its results are read (ablation only: same scales, same
    gradients, another schedule)."""
    return _replaced("_crossings", "Crossings", _none_waits)


def _without_indices(make_plan, *args, indices=(), **kwargs):
    return make_plan(*args, **kwargs)


def constant_offsets() -> contextlib.AbstractContextManager:
    """Steps traced inside read each component's scale at a constant offset
    of the vector of scales, where keras_als reads it through a runtime index
    (`keras_als.step._indices`; ablation only: the same values, more kernels
    for XLA to compile)."""
    return _replaced(
        "_plan", "make_plan", lambda original: functools.partial(_without_indices, original)
    )


def feature_maps_divided() -> contextlib.AbstractContextManager:
    """Steps traced inside divide every boundary's gradients, feature maps'
    too, where keras_als multiplies those of rank above
    `keras_als.step._boundary.DIVIDED_RANK` not made by one of its
    `DIVIDED_OPERATIONS` by the reciprocal (a variant, not a part left out:
    the same values, another program)."""
    return _replaced("_boundary", "DIVIDED_RANK", lambda _: 8)


def feature_maps_multiplied() -> contextlib.AbstractContextManager:
    """Steps traced inside multiply every feature map's gradient by the
    reciprocal, where keras_als divides those made by a convolution or a
    concatenation (`keras_als.step._boundary.DIVIDED_OPERATIONS`; a variant:
    the same values, another program)."""
    return _replaced("_boundary", "DIVIDED_OPERATIONS", lambda _: frozenset())


NAMED = {
    "no_crossing_reductions": without_crossing_reductions,
    "no_concatenation_reductions": without_concatenation_reductions,
    "joins_read": joins_read,
    "crossings_reduced_last": crossings_reduced_last,
    "crossings_reduced_early": crossings_reduced_early,
    "crossings_never_wait": crossings_never_wait,
    "constant_offsets": constant_offsets,
    "no_boundary_rescaling": without_boundary_rescaling,
    "feature_maps_divided": feature_maps_divided,
    "feature_maps_multiplied": feature_maps_multiplied,
}
"""The ablations a command can name."""


def named(name: str) -> contextlib.AbstractContextManager:
    """The ablation called `name` (of `NAMED`), or nothing for ""."""
    if not name:
        return contextlib.nullcontext()
    if name not in NAMED:
        raise ValueError(f"Unknown ablation {name!r}; known: {', '.join(NAMED)}.")
    return NAMED[name]()
