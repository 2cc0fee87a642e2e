"""What one training step measured, per scale component.

`measure` turns the gradients a step computed into `policies.Statistics`:
the largest value, mean square and overflow origin of each component, from
the weight gradients and from the gradients that crossed the boundaries.
All of it is computed where the optimizer applies the step, inside the one
branch that runs on the steps that measure.
Each gradient's own reductions are `_reductions`'.
`agree_across_replicas` and `reached_on_any_replica` make every replica
decide alike; `underflow_shares` measures underflow for the telemetry, and
`mean_over_replicas` makes every replica record the same.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import tensorflow as tf

from keras_als import policies
from keras_als.step._reductions import amaxes, mean_square, subnormals, zeros


def measure(plan, weight_amax: WeightAmax, weight_grads, crossed) -> policies.Statistics:
    """The statistics of each component of `plan`, in true (unscaled) units.

    From the weight gradients (`weight_grads[i]`: component i's; `weight_amax`,
    each one's largest magnitude, taken on every step to check it is finite) and from
    the gradients that crossed the boundaries during backprop, as reduced by
    `plan.crossings` (call its `complete` first), packed into `crossed`
    (`_crossings.Crossed.of(plan)`, made before the branch that measures). Statistics
    no policy reads are pruned from the traced graph, so they cost nothing.

    A few vector operations for all components, whatever their number: the
    values are gathered into vectors, each with the component it counts for
    (`Layout`), and reduced per component by segment. Built as scalar
    operations per component instead, they added 33 kernels to the compiled
    step of a tiny KerasHub GPT-2 (19 scales), and time to its compilation.
    """
    layout = Layout.of(plan, weight_amax.components)
    n = len(plan.components)
    scales = plan.scales
    arrived = crossed.amaxes(layout.incoming)
    # An incoming gradient at this component's scale, and inf where it would overflow there.
    ratios = tf.gather(scales, _indices(layout.into)) / tf.gather(scales, _indices(layout.source))
    post = arrived * ratios
    capped = tf.where(post > layout.limits, float("inf"), post)
    inside = crossed.amaxes(layout.inside)
    values = tf.concat([weight_amax.values, inside, capped], axis=0)
    largest = _segment_max(values, list(layout.seen_at) + list(layout.into), n)
    amax = largest / scales
    incoming_infinite = _segment_any(tf.logical_not(tf.math.is_finite(arrived)), layout.into, n)
    overflow = tf.logical_and(
        tf.logical_not(tf.math.is_finite(amax)), tf.logical_not(incoming_infinite)
    )
    lost = tf.logical_and(
        layout.rounds, tf.logical_and(arrived > 0, post < policies.FLOAT16_TINY / 2)
    )
    silent = tf.logical_and(layout.has_incoming, _segment_max(arrived, layout.into, n) == 0)
    return policies.Statistics(
        amax=amax,
        mean_square=_mean_squares(plan, crossed, weight_grads) / (scales * scales),
        overflow=overflow,
        silent=silent,
        downstream=plan.downstream(),
        names=tuple(c.name for c in plan.components),
        flushed=_segment_any(lost, layout.into, n),
    )


class WeightAmax(NamedTuple):
    """Each weight gradient's largest magnitude (`amaxes`), in one float32 vector.

    The finiteness check of every step and the measuring branch read the one
    vector. Read as one scalar each, every value was widened to float32 in a
    kernel of its own for each reader in XLA's CPU program: 53 more kernels
    in a tiny KerasHub BERT's compiled step (`python -m benchmarks.real_models
    --parts graph`).

    Example:

    >>> grads = [[tf.constant([1.0, -3.0])], [], [tf.constant([2.0])]]
    >>> amax = WeightAmax.of(grads)
    >>> amax.values.numpy().tolist(), amax.components
    ([3.0, 2.0], (0, 2))
    """

    values: tf.Tensor  # float32, one per weight gradient; inf: not finite
    components: tuple[int, ...]  # the component of each

    @classmethod
    def of(cls, weight_grads: list[list]) -> WeightAmax:
        """From the weight gradients of each component (`weight_grads[i]`: component i's)."""
        each = amaxes([g for group in weight_grads for g in group])
        values = tf.abs(_vector(each))  # one `Abs` for all: a zero that read -0.0 reads 0.0
        return cls(values, tuple(i for i, group in enumerate(weight_grads) for _ in group))

    def extended(self, more: list[tuple[int, tf.Tensor]]) -> WeightAmax:
        """These values followed by `more`, pairs of (component, float32 scalar)."""
        if not more:
            return self
        values = tf.concat([self.values, tf.stack([value for _, value in more])], axis=0)
        return WeightAmax(values, self.components + tuple(i for i, _ in more))


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where each value `measure` reads lies, as constant index lists.

    Attributes:
        seen_at: For each weight gradient (component by component), then for
            each boundary of `inside`, the component whose largest value it counts for.
        inside: Boundaries whose crossing gradient was reduced, by the component
            it lies in (the wrapped layer's side).
        incoming: Boundaries whose gradient flows from another component
            (`source`, the layer's side) into the component `into`.
        into: For each of `incoming`, the component its gradient flows into.
        source: For each of `incoming`, the component it comes from.
        limits: For each of `incoming`, the largest finite value of the
            gradient's dtype on the upstream side.
        rounds: For each of `incoming`, whether it rounds to float16 upstream.
        has_incoming: Per component, whether any gradient flows into it.
    """

    seen_at: tuple[int, ...]
    inside: tuple
    incoming: tuple
    into: tuple[int, ...]
    source: tuple[int, ...]
    limits: tf.Tensor
    rounds: tf.Tensor
    has_incoming: tf.Tensor

    @classmethod
    def of(cls, plan, weight_components) -> Layout:
        """The layout of `plan`'s values, with `weight_components` the component
        of each weight gradient's largest magnitude."""
        crossed = plan.crossings.reduced
        weights = list(weight_components)
        inside = [
            (b, i) for i, c in enumerate(plan.components) for b in c.inside if id(b) in crossed
        ]
        incoming = [
            (b, i, plan.sides[id(b)][1])
            for i, c in enumerate(plan.components)
            for b in c.feeding
            if id(b) in crossed and plan.sides[id(b)][1] != i
        ]
        into = tuple(i for _, i, _ in incoming)
        return cls(
            seen_at=tuple(weights + [i for _, i in inside]),
            inside=tuple(b for b, _ in inside),
            incoming=tuple(b for b, _, _ in incoming),
            into=into,
            source=tuple(o for _, _, o in incoming),
            limits=tf.constant([float(b.limit) for b, _, _ in incoming], tf.float32),
            rounds=tf.constant(
                [bool(b.limit <= policies.FLOAT16_MAX) for b, _, _ in incoming], tf.bool
            ),
            has_incoming=tf.constant([i in into for i in range(len(plan.components))], tf.bool),
        )


def _mean_squares(plan, crossed, weight_grads) -> tf.Tensor:
    """Per component, the mean square of the gradients crossing its boundaries
    (of its weight gradients where none was reduced), at its scale; 0 where
    there are none."""
    reduced, at, squares, squares_at = [], [], [], []
    for i, component in enumerate(plan.components):
        inside = [b for b in component.inside if id(b) in crossed.square_at]
        if inside:
            reduced += inside
            at += [i] * len(inside)
        else:
            squares += [mean_square(g) for g in weight_grads[i]]
            squares_at += [i] * len(weight_grads[i])
    if not at and not squares:
        return tf.zeros([len(plan.components)])
    values = tf.concat([crossed.mean_squares(reduced), _vector(squares)], axis=0)
    return _segment_mean(values, at + squares_at, len(plan.components))


def _indices(indices) -> tf.Tensor:
    return tf.constant(list(indices), tf.int32)


def _vector(scalars: list) -> tf.Tensor:
    return tf.stack(scalars) if scalars else tf.zeros([0])


def _segment_max(values: tf.Tensor, segments, n: int) -> tf.Tensor:
    """Per segment, the largest of `values` (all >= 0), 0 for an empty segment.

    A masked reduction over a constant membership matrix, a few small
    elementwise operations and one reduction (a segment operation would be
    a scatter in XLA).
    """
    if not len(segments):
        return tf.zeros([n])
    inside = _membership(segments, n)
    return tf.reduce_max(tf.where(inside, values[None, :], 0.0), axis=1)


def _segment_any(flags: tf.Tensor, segments, n: int) -> tf.Tensor:
    """Per segment, whether any of `flags` holds (False for an empty segment)."""
    if not len(segments):
        return tf.zeros([n], tf.bool)
    return tf.reduce_any(tf.logical_and(_membership(segments, n), flags[None, :]), axis=1)


def _segment_mean(values: tf.Tensor, segments, n: int) -> tf.Tensor:
    """Per segment, the mean of `values`, 0 for an empty segment."""
    inside = _membership(segments, n)
    counts = tf.constant([max(list(segments).count(i), 1) for i in range(n)], tf.float32)
    return tf.reduce_sum(tf.where(inside, values[None, :], 0.0), axis=1) / counts


def _membership(segments, n: int) -> tf.Tensor:
    """`[i, k]` is True where value k lies in segment i (a constant)."""
    return tf.constant([[s == i for s in segments] for i in range(n)], tf.bool)


def underflow_shares(plan, weight_grads, float16) -> tuple[tf.Tensor, tf.Tensor]:
    """Per component, the shares of float16 subnormals and of exact zeros.

    The layers' input gradients (at the boundaries) and weight gradients
    count. A *subnormal* is a non-zero float16 value below `2**-14`, the
    smallest normal: it has already lost precision, and it is where underflow
    starts, so its share is the underflow that scaling causes or could cause.
    Exact zeros are reported apart: most are true zeros (dead ReLU units,
    anchors that hard negative mining leaves out), which float32 has as well.
    Only gradients computed in float16 count towards subnormals.

    Args:
        plan: The step's plan, its crossings finished.
        weight_grads: Per component, the weight gradients (at its scale).
        float16: Per component, for each weight gradient, whether it was
            computed in float16.

    Returns:
        `(subnormal_share, zero_share)`, float32 vectors with one entry per component.
    """
    subnormal_shares, zero_shares = [], []
    crossed = plan.crossings.reduced
    for i, component in enumerate(plan.components):
        counts = []
        for g, half in zip(weight_grads[i], float16[i]):
            zero, size = zeros(g)
            counts.append((zero, subnormals(g) if half else tf.constant(0.0), size))
        counts += [
            (crossed[id(b)].zeros, crossed[id(b)].subnormals, crossed[id(b)].size)
            for b in component.inside
            if id(b) in crossed and crossed[id(b)].zeros is not None
        ]
        if counts:
            size = tf.maximum(tf.add_n([c[2] for c in counts]), 1.0)
            zero_shares.append(tf.add_n([c[0] for c in counts]) / size)
            subnormal_shares.append(tf.add_n([c[1] for c in counts]) / size)
        else:
            zero_shares.append(tf.constant(0.0))
            subnormal_shares.append(tf.constant(0.0))
    return tf.stack(subnormal_shares), tf.stack(zero_shares)


def measure_if(
    measuring, plan, weight_amax: WeightAmax, weight_grads, crossed
) -> policies.Statistics:
    """`measure(...)` where `measuring` holds, else statistics that keep every scale.

    One branch computes every reduction; a step that does not measure reads
    zeros, no overflow and every component silent. The branch returns tensors
    only, so it may run in a replica context (no collective, no assignment).
    """
    size = len(plan.components)

    def measured():
        return tuple(measure(plan, weight_amax, weight_grads, crossed)[:4])

    def kept():
        zero = tf.zeros([size])
        return zero, zero, tf.zeros([size], tf.bool), tf.ones([size], tf.bool)

    amax_, mean_square_, overflow, silent = tf.cond(measuring, measured, kept)
    names = tuple(c.name for c in plan.components)
    return policies.Statistics(amax_, mean_square_, overflow, silent, plan.downstream(), names)


def several_replicas() -> bool:
    """True inside a replica context with more than one replica in sync."""
    context = tf.distribute.get_replica_context()
    return context is not None and context.num_replicas_in_sync > 1


def agree_across_replicas(statistics: policies.Statistics) -> policies.Statistics:
    """Takes the largest statistics over all replicas, so all choose alike."""
    if not several_replicas():
        return statistics
    context = tf.distribute.get_replica_context()
    packed = tf.stack(
        [
            statistics.amax,
            statistics.mean_square,
            tf.cast(statistics.overflow, tf.float32),
            tf.cast(tf.logical_not(statistics.silent), tf.float32),
        ]
    )
    packed = tf.reduce_max(context.all_gather(packed[None], axis=0), axis=0)
    return statistics._replace(
        amax=packed[0], mean_square=packed[1], overflow=packed[2] > 0, silent=packed[3] == 0
    )


def mean_over_replicas(values: tf.Tensor) -> tf.Tensor:
    """`values` averaged over all replicas (each replica's share of its own
    batch; replicas hold equal batches under `MirroredStrategy`), so that
    every replica writes the same telemetry."""
    if not several_replicas():
        return values
    return tf.distribute.get_replica_context().all_reduce("MEAN", values)


def reached_on_any_replica(reached: tf.Tensor) -> tf.Tensor:
    """Per component, True if an overflow reached it on any replica, so all
    replicas skip the same steps and back off the same scales."""
    if not several_replicas():
        return reached
    flags = tf.distribute.get_replica_context().all_gather(
        tf.cast(reached, tf.float32)[None], axis=0
    )
    return tf.reduce_max(flags, axis=0) > 0
