"""What one training step measured, per scale component.

`measure` turns the gradients a step computed into `policies.Statistics`:
the largest value, mean square and overflow origin of each component, from
the weight gradients and from what the boundaries saw during backprop.
`agree_across_replicas` and `finite_on_every_replica` make every replica
decide alike; `zero_shares` measures underflow for the telemetry.
"""

from __future__ import annotations

import tensorflow as tf

from keras_als import _boundary, policies


def measure(plan, weight_amax, weight_grads) -> policies.Statistics:
    """The statistics of each component of `plan`, in true (unscaled) units.

    From the weight gradients (their largest values, `weight_amax`) and from
    what the boundaries measured during backprop. Statistics no policy reads
    are pruned from the traced graph, so they cost nothing.
    """
    amax, mean_square, overflow, silent = [], [], [], []
    for i, component in enumerate(plan.components):
        scale = plan.scales[i]
        seen = list(weight_amax[i])
        incoming_finite, incoming_amax = [], []
        for b in component.inside:
            if b.gradient_amax is not None:
                seen.append(b.gradient_amax)
        for b in component.feeding:
            if b.gradient_amax is not None and b.ratio is not None:
                post = b.gradient_amax * b.ratio
                limit = b.inputs[0].dtype.max
                seen.append(tf.where(post > limit, float("inf"), post))
                incoming_finite.append(tf.math.is_finite(b.gradient_amax))
                incoming_amax.append(b.gradient_amax)
        component_amax = tf.reduce_max(tf.stack(seen)) / scale if seen else tf.constant(0.0)
        squares = [
            b.gradient_mean_square for b in component.inside if b.gradient_mean_square is not None
        ] or [_boundary.mean_square(g) for g in weight_grads[i]]
        component_square = (
            tf.add_n(squares) / len(squares) / (scale * scale) if squares else tf.constant(0.0)
        )
        came_in_finite = (
            tf.reduce_all(tf.stack(incoming_finite)) if incoming_finite else tf.constant(True)
        )
        amax.append(component_amax)
        mean_square.append(component_square)
        started_here = tf.logical_not(tf.math.is_finite(component_amax))
        overflow.append(tf.logical_and(started_here, came_in_finite))
        silent.append(
            tf.reduce_max(tf.stack(incoming_amax)) == 0 if incoming_amax else tf.constant(False)
        )
    return policies.Statistics(
        amax=tf.stack(amax),
        mean_square=tf.stack(mean_square),
        overflow=tf.stack(overflow),
        silent=tf.stack(silent),
        downstream=plan.downstream(),
        names=tuple(c.name for c in plan.components),
    )


def zero_shares(plan, weight_grads) -> tf.Tensor:
    """Per component, the share of exactly-zero values in its gradients.

    The layers' input gradients (at the boundaries) and weight gradients
    count; underflow shows as zeros, so this bounds the underflow rate from
    above (true zeros, such as those of dead ReLU units, count too).
    """
    shares = []
    for i, component in enumerate(plan.components):
        counts = [_boundary.zeros(g) for g in weight_grads[i]]
        counts += [b.gradient_zeros for b in component.inside if b.gradient_zeros is not None]
        if counts:
            shares.append(tf.add_n([c[0] for c in counts]) / tf.add_n([c[1] for c in counts]))
        else:
            shares.append(tf.constant(0.0))
    return tf.stack(shares)


def unless_measuring(statistics: policies.Statistics, measuring) -> policies.Statistics:
    """`statistics` where `measuring` is true, else statistics that keep every scale."""
    return statistics._replace(
        overflow=tf.logical_and(statistics.overflow, measuring),
        silent=tf.logical_or(statistics.silent, tf.logical_not(measuring)),
    )


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


def finite_on_every_replica(finite: tf.Tensor) -> tf.Tensor:
    """True if `finite` holds on every replica, so all skip or apply alike.

    The all-reduced gradient (a sum) is finite exactly when every replica's
    gradient is, so skipping on this flag is skipping on the all-reduced
    gradients.
    """
    if not several_replicas():
        return finite
    flags = tf.distribute.get_replica_context().all_gather(
        tf.reshape(tf.cast(finite, tf.float32), [1]), axis=0
    )
    return tf.reduce_min(flags) > 0
