"""Bounds on the gradients crossing into joins, from gradients read anyway.

On measuring steps every boundary's crossing gradient is reduced to its
largest magnitude (`_crossings`). For the inputs of a join (a `Concatenate`,
an `Add`) that read is costly: each crossing gradient is a slice of the
join's output gradient, which Keras's program fuses into its consumers and
never writes out, and the read makes XLA write it out on every step (the
measuring branch needs it as a buffer). On DenseNet121 those reads were two
thirds of keras_als's extra step time (`python -m benchmarks.cost_at_size
--models densenet121 --ablation joins_read`).

They need not be read. Take a boundary `b` and the region on its output side
up to the next boundaries (a *side*, one draft component of `_plan._walk`).
If that side holds only operations that hand a gradient on without
enlarging any value (`PASSING`: joins, copies, reshapes, casts, ReLUs), the
gradient crossing `b` is made of the gradients arriving at the boundaries the
side feeds, each taken along a path of slices, masks and sums. So its largest
magnitude is at most the sum, over those boundaries, of theirs times the
number of paths from `b` to each: a bound from values the step reads anyway
(exact but for float16's rounding of the sums). A boundary the side feeds may
be bounded in turn (DenseNet's chained concatenations), so every bound is
expanded, once when the plan is made, into read boundaries only, each with an
integer count (`rows`); on the step, one masked sum over a constant matrix
turns the reads into every bound (`values`).

Only a side that sums is bounded: one whose gradient reaches `b` along two
paths or more (DenseNet's concatenation, which feeds the next normalization
and the next concatenation; a residual `Add` feeding the next block and the
next `Add`). That sum is what Keras's step never writes out. Along one path
the crossing gradient is a slice or a copy of one gradient read anyway
(a transformer's `Add` before its `LayerNormalization`, an SSD's heads
concatenated into its output): it is read, cheaply and exactly.

A bound is larger than the read it replaces by at most the sum's number of
terms: a DenseNet block's first concatenation sums its block's two dozen
reads. The scales it gives are lower, never higher, than a read's. Sides with
any other operation (a layer's weights, a normalization, the loss) keep their
reads, and so do all boundaries under a policy that reads mean squares
(`ApproxRange`), which a bound does not give.
"""

from __future__ import annotations

import collections
import dataclasses

import tensorflow as tf

PASSING = frozenset(
    {
        "AddN",
        "AddV2",
        "Cast",
        "ConcatV2",
        "ExpandDims",
        "Identity",
        "Relu",
        "Reshape",
        "Squeeze",
        "Transpose",
    }
)
"""Operations whose gradient with respect to each input takes every value
from at most one value of the output's gradient, unchanged or zeroed (a sum
of several inputs hands each input the whole gradient)."""


class _NotPassing(Exception):
    pass


def carries_gradient(dtype: tf.DType) -> bool:
    """False for integer, boolean and string tensors, which no gradient flows
    through (a shape, an index, a mask)."""
    return not (dtype.is_integer or dtype.is_bool or dtype == tf.string)


def rows(reached: list, sides: dict, feeding: list, loss_side: int) -> dict:
    """The boundaries that can be bounded, each with the reads that bound it.

    Args:
        reached: Every boundary the plan's walk reached.
        sides: id(boundary) -> (input side, output side), a side being a
            draft component of the walk.
        feeding: Per side, the boundaries whose input lies there.
        loss_side: The loss's side (its gradient comes from the loss, not
            from boundaries: never bounded).

    Returns:
        id(boundary) -> {read boundary: number of paths}; boundaries not in
        it are read.
    """
    stop = {t.ref(): b for b in reached for t in b.outputs}
    paths: dict = {}  # side -> id(boundary with its output there) -> {fed boundary: paths}
    for side in {sides[id(b)][1] for b in reached} - {loss_side}:
        try:
            paths[side] = _paths_to_fed(feeding[side], stop)
        except _NotPassing:
            pass

    def fed_by(b) -> dict:
        """{fed boundary: paths} of a boundary whose gradient sums two paths or
        more (one path is a slice or a copy of a read: read cheaply), else {}."""
        fed = paths.get(sides[id(b)][1], {}).get(id(b), {})
        return fed if sum(fed.values()) >= 2 else {}

    try:
        found = _expanded(list(reached), fed_by)
    except _NotPassing:
        return {}
    return {key: row for key, row in found.items() if row is not None}


def _expanded(boundaries: list, fed_by) -> dict:
    """id(boundary) -> {read boundary: paths}, or None for a boundary that is
    read: each bounded boundary's fed boundaries (`fed_by`), the bounded
    among them replaced by their own reads, depth first without recursion
    (residual chains can be hundreds of joins long)."""
    rows: dict = {}
    for start in boundaries:
        stack, entered = [start], set()
        while stack:
            b = stack[-1]
            if id(b) in rows:
                stack.pop()
                continue
            fed = fed_by(b)
            waiting = [f for f in fed if id(f) not in rows]
            if waiting and id(b) not in entered:
                entered.add(id(b))
                for f in waiting:
                    if id(f) in entered:
                        raise _NotPassing("a cycle")  # never in a traced step
                    stack.append(f)
                continue
            if waiting:
                raise _NotPassing("a cycle")
            stack.pop()
            row = collections.Counter()
            for f, count in fed.items():
                for read, n in (rows[id(f)] or {f: 1}).items():
                    row[read] += count * n
            rows[id(b)] = dict(row) if fed else None
    return rows


def _paths_to_fed(fed: list, stop: dict) -> dict:
    """For each boundary whose output lies on the side that `fed` are fed by:
    id -> {fed boundary: number of paths}; raises `_NotPassing` if the side
    holds any other operation than `PASSING`."""
    result = collections.defaultdict(collections.Counter)
    for f in fed:
        memo: dict = {}
        for tensor in f.inputs:
            for source, count in _paths_back(tensor, stop, memo).items():
                result[source][f] += count
    return {source: dict(counts) for source, counts in result.items()}


def _paths_back(tensor, stop: dict, memo: dict) -> collections.Counter:
    """id(boundary) -> number of paths from that boundary's outputs to `tensor`."""
    key = tensor.ref()
    if key in memo:
        return memo[key]
    found = collections.Counter()
    if key in stop:
        found[id(stop[key])] = 1
    elif carries_gradient(tensor.dtype):
        op = tensor.op
        if op.type not in PASSING:
            raise _NotPassing(op.type)
        for source in op.inputs:
            found.update(_paths_back(source, stop, memo))
    memo[key] = found
    return found


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The bounds of one plan: `rows` (see `rows`), its scales per component
    and its boundaries' sides (id -> (input side, output side) components)."""

    rows: dict
    scales: tf.Tensor
    sides: dict

    def covers(self, boundary, unread: set) -> bool:
        """Whether `boundary` is bounded: it has a row, and every read in it
        was read in this graph (ids in `unread` were not)."""
        row = self.rows.get(id(boundary))
        return row is not None and not any(id(r) in unread for r in row)

    def values(self, bounded: list, reduced: dict) -> dict:
        """`values(...)` of `bounded` under this plan."""
        return values(self.rows, bounded, reduced, self.scales, self.sides)


def values(rows: dict, bounded: list, reduced: dict, scales: tf.Tensor, sides: dict) -> dict:
    """Each bounded boundary's bound, at its output side's scale, from the reads.

    Args:
        rows: The plan's `rows`.
        bounded: The boundaries to bound on this step.
        reduced: id(boundary) -> its `_crossings.Reduced` (a read boundary
            missing from it had no gradient, and counts 0).
        scales: The plan's scales, per component.
        sides: id(boundary) -> (input side, output side) components.

    Returns:
        id(boundary) -> float32 scalar: at least the largest magnitude of its
        crossing gradient (inf where a read was not finite, 0 where no read was).
    """
    reads = list({id(r): r for b in bounded for r in rows[id(b)]}.values())
    if not reads:
        return {id(b): tf.constant(0.0) for b in bounded}
    index = {id(r): k for k, r in enumerate(reads)}
    counts = [[0.0] * len(reads) for _ in bounded]
    for i, b in enumerate(bounded):
        for r, n in rows[id(b)].items():
            counts[i][index[id(r)]] = float(n)
    zero = tf.constant(0.0)
    amax = tf.stack([reduced[id(r)].amax if id(r) in reduced else zero for r in reads])
    true = amax / tf.gather(scales, [sides[id(r)][1] for r in reads])
    counts = tf.constant(counts)
    summed = tf.reduce_sum(tf.where(counts > 0, counts * true[None, :], 0.0), axis=1)
    bounds = summed * tf.gather(scales, [sides[id(b)][1] for b in bounded])
    return {id(b): value for b, value in zip(bounded, tf.unstack(bounds))}
