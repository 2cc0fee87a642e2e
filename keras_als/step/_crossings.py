"""Reductions of the gradients that cross the scale boundaries, in few branches.

On the steps that measure, the statistics need each boundary's crossing
gradient reduced to its largest absolute value and mean square (and, for the
telemetry, its counts of exact zeros and of float16 subnormals). Those
reductions run in conditional branches taken only on measuring steps. One
branch per boundary costs the compiled step one conditional per wrapped layer
(no faster, and slower to compile); one branch for all, after backprop, keeps
every crossing gradient alive until then. `Crossings` takes the middle way:
gradients wait as they arrive, and the waiting ones are reduced together in
one branch as soon as they hold `WAITING_BYTES` or more, which bounds the
memory they keep alive; `finish` reduces the last ones. A gradient that
fills a group on its own (`WAITING_BYTES` or more) is made to wait for its
branch: the boundary adds to its factor an exact zero read from the branch's
result, so XLA runs the branch where the gradient arrives and can free it
there. Without that, XLA schedules a branch where its results are read,
after backprop, and keeps its operands alive until then. Only lone gradients
wait: making every group wait ties XLA's schedule and raises peak memory.

XLA turns a conditional whose branches hold only elementwise operations and
reductions into a select of both branches (`ConditionalSimplifier`), so the
reductions would run on every step, fused into the kernels that produce the
gradients, which is slower. A branch reads its values out through a gather,
which XLA counts as expensive, so it keeps the branch.

A branch is a function traced once for each group of gradients of the same
shapes, dtypes and grouping, and every group like it calls the same one
through a `StatelessIf`: a transformer's crossing gradients have a few shapes,
so its hundred branches share a few functions, and TensorFlow's lowering to
XLA, which lowers a function once for all its calls, lowers a few. Built with
`tf.cond`, each branch was a graph of its own: on ViT-Base (100 branches)
tracing the step took 5.3 s and lowering it 5.9 s, against 3.8 s and 4.0 s
with shared functions (`python -m benchmarks.profiles first_step --models
vit_base`; Keras's optimizer 2.7 s and 2.4 s).

A boundary whose gradient `_join_bounds` can bound from the others (a
join's input) is not reduced: `complete` gives it its bound instead.

A branch reduces the mean squares even when the policy reads none (only
`ApproxRange` does): they keep XLA from fusing the branch's largest-value
reductions into the gather that keeps the branch, a kernel slow to compile.

The measurements behind these choices: `python -m benchmarks.suite.memory
--breakdown transformer` (the `crossings_never_wait`, `crossings_reduced_early`
and `crossings_reduced_last` variants) and `benchmarks/README.md`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import tensorflow as tf

from keras_als.step import _join_bounds
from keras_als.step._reductions import amaxes, mean_square, subnormals, values_of, zeros

WAITING_BYTES = 64 * 1024
"""Crossing gradients kept alive at most (plus the one that arrived last)."""


@dataclasses.dataclass(frozen=True)
class Reduced:
    """One boundary's crossing gradient, reduced (float32 scalars; zeros read 0
    on the steps that do not measure)."""

    amax: tf.Tensor  # largest absolute value (or a bound on it); inf if a value was not finite
    mean_square: tf.Tensor | None  # None where the amax is a bound (`_join_bounds`)
    zeros: tf.Tensor | None = None  # exact zeros (None unless counted)
    subnormals: tf.Tensor | None = None  # non-zero float16 values below 2**-14
    size: tf.Tensor | None = None  # values


class Crossed(NamedTuple):
    """The reduced crossing gradients of a plan, packed into two vectors.

    Made before the branch that measures, so that the branch reads two
    tensors, not two per boundary: each is an input of the branch, which
    TensorFlow traces and lowers to XLA one by one (ViT-Base's branch took
    203). Inside, `amaxes` and `mean_squares` read them in one gather each.

    Example:

    >>> a, b = object(), object()
    >>> crossed = Crossed.pack({id(a): Reduced(tf.constant(2.0), tf.constant(1.0)),
    ...                         id(b): Reduced(tf.constant(3.0), None)})
    >>> crossed.amaxes([b, a]).numpy().tolist(), crossed.mean_squares([a]).numpy().tolist()
    ([3.0, 2.0], [1.0])
    """

    amax: tf.Tensor  # float32, one per boundary reduced or bounded
    mean_square: tf.Tensor  # float32, one per boundary reduced (not bounded)
    amax_at: dict  # id(boundary) -> its position in `amax`
    square_at: dict  # id(boundary) -> its position in `mean_square`

    @classmethod
    def of(cls, plan) -> Crossed:
        """Packs `plan.crossings.reduced` (empty without crossings; call
        `Crossings.complete` first)."""
        return cls.pack(plan.crossings.reduced if plan.crossings is not None else {})

    @classmethod
    def pack(cls, reduced: dict) -> Crossed:
        """Packs `reduced`, `id(boundary) -> _crossings.Reduced`."""
        squared = [key for key, r in reduced.items() if r.mean_square is not None]
        return cls(
            # One `Abs` for all: a gradient of zeros may have read -0.0 (`magnitude_of`).
            amax=tf.abs(_stacked([r.amax for r in reduced.values()])),
            mean_square=_stacked([reduced[key].mean_square for key in squared]),
            amax_at={key: k for k, key in enumerate(reduced)},
            square_at={key: k for k, key in enumerate(squared)},
        )

    def amaxes(self, boundaries) -> tf.Tensor:
        """The largest magnitudes (or bounds) of `boundaries`' gradients, as a vector."""
        return _gather(self.amax, [self.amax_at[id(b)] for b in boundaries])

    def mean_squares(self, boundaries) -> tf.Tensor:
        """The mean squares of `boundaries`' gradients (each reduced), as a vector."""
        return _gather(self.mean_square, [self.square_at[id(b)] for b in boundaries])


def _gather(vector: tf.Tensor, positions: list[int]) -> tf.Tensor:
    return tf.gather(vector, tf.constant(positions, tf.int32)) if positions else tf.zeros([0])


def _stacked(scalars: list) -> tf.Tensor:
    return tf.stack(scalars) if scalars else tf.zeros([0])


class Crossings:
    """Collects the crossing gradients of one traced step and reduces them.

    Args:
        graph: The graph of the step; gradients from other (nested) graphs are
            not part of its plan and are ignored.
        measuring: Scalar bool tensor: reduce only when it is true (else every
            reduction reads 0). None: every step.
        count_zeros: Whether to count exact zeros and float16 subnormals too.
        bounds: The plan's `_join_bounds.Bounds`: boundaries bounded, not
            reduced. None: every boundary is reduced.
    """

    def __init__(
        self,
        graph,
        measuring: tf.Tensor | None,
        count_zeros: bool,
        bounds: _join_bounds.Bounds | None = None,
    ):
        self.graph = graph
        self.measuring = measuring
        self.count_zeros = count_zeros
        self.per_boundary = 5 if count_zeros else 2  # values of each `Reduced`
        self.bounds = bounds
        self.reduced: dict[int, Reduced] = {}  # id(boundary) -> its reduction
        self._waiting: list[tuple[object, list[tf.Tensor]]] = []
        self._waiting_bytes = 0
        self._bounded: list = []  # boundaries whose gradients arrived, to be bounded
        self._unread: set[int] = set()  # id(boundary) with gradients from another graph
        self._traced: dict = {}  # shapes, dtypes and grouping -> the two branches

    def arrived(self, boundary, gradients) -> tf.Tensor | None:
        """Takes the gradients that crossed `boundary` (called during backprop).

        Returns an exact float32 zero read from their branch if they filled a
        group alone (the boundary adds it to its factor, so that they wait for
        their reductions), else None.
        """
        mine = [g for g in gradients if values_of(g).graph is self.graph]
        if len(mine) < len(gradients):
            self._unread.add(id(boundary))
        if not mine:
            return None
        if self.bounds is not None and self.bounds.covers(boundary, self._unread):
            self._bounded.append(boundary)
            return None
        gradients = mine
        alone = not self._waiting
        self._waiting.append((boundary, gradients))
        self._waiting_bytes += sum(_bytes(g) for g in gradients)
        if self._waiting_bytes < WAITING_BYTES:
            return None
        self.finish()
        return self.zero_after(boundary) if alone else None

    def zero_after(self, boundary) -> tf.Tensor:
        """0.0, read from the reductions of `boundary`'s gradients: their
        largest magnitude is >= 0 or inf, never NaN, so its minimum with 0 is 0."""
        return tf.minimum(self.reduced[id(boundary)].amax, 0.0)

    def complete(self) -> None:
        """Reduces the gradients still waiting, then bounds the bounded ones
        (call once, after backprop)."""
        self.finish()
        bounded, self._bounded = self._bounded, []
        if bounded:
            for key, value in self.bounds.values(bounded, self.reduced).items():
                self.reduced[key] = Reduced(value, None)

    def finish(self) -> None:
        """Reduces every waiting gradient, in one branch."""
        waiting, self._waiting, self._waiting_bytes = self._waiting, [], 0
        if not waiting:
            return
        per_boundary = self.per_boundary
        tensors = [values_of(g) for _, gradients in waiting for g in gradients]
        groups = tuple(len(gradients) for _, gradients in waiting)
        reduce, nothing = self._branches(tensors, groups)
        outputs = per_boundary * len(waiting)
        if self.measuring is None:
            values = reduce(*tensors)
        else:
            values = tf.raw_ops.StatelessIf(
                cond=self.measuring,
                input=tensors,
                Tout=[tf.float32] * outputs,
                then_branch=reduce,
                else_branch=nothing,
                output_shapes=[tf.TensorShape([])] * outputs,
            )
        for k, (boundary, _) in enumerate(waiting):
            self.reduced[id(boundary)] = Reduced(*values[per_boundary * k : per_boundary * (k + 1)])

    def _branches(self, tensors: list[tf.Tensor], groups: tuple[int, ...]):
        """The two branches for `tensors` (`groups[k]` of them per boundary),
        traced once for every group of gradients with the same shapes, dtypes
        and grouping (see the module docstring)."""
        key = (tuple((tuple(t.shape.as_list()), t.dtype) for t in tensors), groups)
        if key not in self._traced:
            specs = [tf.TensorSpec(t.shape, t.dtype) for t in tensors]
            count_zeros = self.count_zeros

            def reduce(*tensors):
                values = []
                each = iter(amaxes(list(tensors)))
                at = iter(tensors)
                for size in groups:
                    mine = [next(at) for _ in range(size)]
                    largest = [next(each) for _ in mine]
                    values.append(largest[0] if size == 1 else tf.reduce_max(tf.stack(largest)))
                    values.append(tf.add_n([mean_square(g) for g in mine]) / size)
                    if count_zeros:
                        counts = [zeros(g) for g in mine]
                        values.append(tf.add_n([c[0] for c in counts]))
                        values.append(tf.add_n([_float16_subnormals(g) for g in mine]))
                        values.append(tf.add_n([c[1] for c in counts]))
                return _kept_by_xla(values)

            outputs = self.per_boundary * len(groups)

            def nothing(*tensors):
                return (tf.constant(0.0),) * outputs

            self._traced[key] = tuple(
                tf.function(branch, autograph=False).get_concrete_function(*specs)
                for branch in (reduce, nothing)
            )
        return self._traced[key]


def _kept_by_xla(values: list[tf.Tensor]) -> tuple[tf.Tensor, ...]:
    """`values`, read out of a stack through a gather, which XLA does not turn
    into a select: a branch that returns them stays a branch."""
    return tuple(tf.unstack(tf.gather(tf.stack(values), tf.range(len(values)))))


def _float16_subnormals(gradient) -> tf.Tensor:
    """Subnormals of a float16 gradient; none in a float32 one, which cannot underflow there."""
    if values_of(gradient).dtype != tf.float16:
        return tf.constant(0.0)
    return subnormals(gradient)


def _bytes(tensor) -> int:
    """Bytes of `tensor`'s values, counting a dimension unknown when traced as 1."""
    tensor = values_of(tensor)
    dims = [d if d is not None else 1 for d in tensor.shape.as_list()] if tensor.shape.rank else []
    return math.prod(dims) * tensor.dtype.size
