"""What one training step measured, per scale component.

`measure` turns the gradients a step computed into `policies.Statistics`:
the largest value, mean square and overflow origin of each component, from
the weight gradients and from what the boundaries saw during backprop.
`agree_across_replicas` makes every replica decide alike; `zero_shares`
measures underflow for the telemetry.
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


def agree_across_replicas(statistics: policies.Statistics, finite):
    """Takes the largest statistics over all replicas, so all decide alike.

    The all-reduced gradient (a sum) is finite exactly when every replica's
    gradient is, so skipping on the reduced `finite` is skipping on the
    all-reduced gradients; the same statistics give every replica the same
    next scales.
    """
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return statistics, finite
    packed = tf.stack(
        [
            statistics.amax,
            statistics.mean_square,
            tf.cast(statistics.overflow, tf.float32),
            tf.cast(tf.logical_not(statistics.silent), tf.float32),
            tf.fill(tf.shape(statistics.amax), tf.cast(tf.logical_not(finite), tf.float32)),
        ]
    )
    packed = tf.reduce_max(context.all_gather(packed[None], axis=0), axis=0)
    agreed = statistics._replace(
        amax=packed[0], mean_square=packed[1], overflow=packed[2] > 0, silent=packed[3] == 0
    )
    return agreed, packed[4][0] == 0
