"""Each gradient reduced to float32 scalars: its largest magnitude, mean
square, exact zeros and float16 subnormals.

`_statistics` reads the weight gradients' reductions, `_crossings` those of
the gradients that cross the boundaries. Each is a few operations per
gradient, and a traced step takes them for every weight gradient (about 200
in ViT-Base): they are chosen for what TensorFlow's lowering to XLA costs
as well as for what they compute (`magnitude_of`).
"""

from __future__ import annotations

import tensorflow as tf


def values_of(tensor):
    """The values of `tensor`, an IndexedSlices (an Embedding's gradient) or a Tensor."""
    return tensor.values if isinstance(tensor, tf.IndexedSlices) else tensor


def amaxes(tensors: list) -> list[tf.Tensor]:
    """Largest absolute value of each of `tensors` (Tensors or IndexedSlices),
    as float32; inf where a value is NaN, 0 where a tensor has no values (0 or
    -0.0 where it holds only zeros: see `magnitude_of`).

    The tensors share the constants they need, infinity and the axes of
    each rank (fewer operations for the compiler: a traced step takes one
    per weight gradient). Each reduces over its own shape: flattened first,
    they made a compiled step slower on a CPU (see
    `_apply_phases.group_by_component`). A float32 gradient that is a
    float16 one widened (a float32 variable used in float16) is reduced as it
    is, in float32, though its float16 source has the same largest value:
    the optimizer's update reads the float32 tensor anyway, and XLA's CPU
    backend reduces it with its fast kernels, where reducing the float16
    source first costs a kernel that writes it out and a slower reduction,
    for every weight gradient (`python -m benchmarks.real_models --parts step
    --models resnet50_v2` measures it).

    Example:

    >>> [float(a) for a in amaxes([tf.constant([1.0, -3.0]), tf.constant([2.0])])]
    [3.0, 2.0]
    """
    infinite, every_axis = {}, {}
    result = []
    for tensor in tensors:
        values = values_of(tensor)
        if values.shape.num_elements() == 0:  # a max of nothing is -inf
            result.append(tf.constant(0.0))
            continue
        magnitude = magnitude_of(values)
        if magnitude.dtype not in infinite:
            infinite[magnitude.dtype] = tf.constant(float("inf"), magnitude.dtype)
        rank = magnitude.shape.rank
        if rank is not None and rank not in every_axis:
            every_axis[rank] = tf.constant(list(range(rank)), tf.int32) if rank else None
        # XLA's CPU backend drops NaN from a max; inf does not go away.
        # (`x != x` holds for NaN alone: `is_nan` costs the bridge as `abs` does.)
        not_a_number = tf.not_equal(magnitude, magnitude)
        magnitude = tf.where(not_a_number, infinite[magnitude.dtype], magnitude)
        largest = tf.reduce_max(magnitude, axis=every_axis.get(rank))
        result.append(tf.cast(largest, tf.float32))
    return result


def magnitude_of(values: tf.Tensor) -> tf.Tensor:
    """`|values|`, as `maximum(values, -values)`; NaN stays NaN.

    Not `tf.abs`: TensorFlow's lowering to XLA takes about 5 ms for each
    `Abs`, whatever its size, against under 1 ms for a `Neg` and a `Maximum`,
    and a traced step takes one per weight gradient (about 200 in ViT-Base:
    a second of its first step; `python -m benchmarks.profiles bridge_ops`).
    A zero may come out as -0.0 (`maximum(-0.0, 0.0)` may return either), and
    so may the largest value of a tensor of zeros: `_statistics.WeightAmax` and
    `_crossings.Crossed` pack those into vectors through one `tf.abs` each.
    """
    return tf.maximum(values, -values)


def mean_square(tensor: tf.Tensor) -> tf.Tensor:
    """Mean of the squared values of `tensor`, in float32."""
    return tf.reduce_mean(tf.square(tf.cast(values_of(tensor), tf.float32)))


def zeros(tensor: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(number of exact zeros, number of values) in `tensor`, as float32."""
    tensor = values_of(tensor)
    count = tf.reduce_sum(tf.cast(tf.equal(tensor, 0), tf.float32))
    return count, tf.cast(tf.size(tensor), tf.float32)


def subnormals(tensor) -> tf.Tensor:
    """Number of non-zero values below float16's smallest normal (`2**-14`), as float32.

    For a float32 tensor that holds a float16 result (a weight gradient cast
    back to its float32 variable) the count is the same as in float16.
    """
    tensor = values_of(tensor)
    magnitude = magnitude_of(tensor)
    tiny = tf.logical_and(magnitude > 0, magnitude < tf.cast(2.0**-14, tensor.dtype))
    return tf.reduce_sum(tf.cast(tiny, tf.float32))
