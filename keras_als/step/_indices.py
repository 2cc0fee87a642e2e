"""Scalars read out of a vector at an index XLA cannot see.

A traced step reads many scalars out of small vectors: each weight update its
component's scale, each boundary its factor. Read at a constant offset,
`vector[i]`, XLA fuses the slice into the kernel that uses it, and the offset
becomes part of that kernel's code: the updates of two layers of one shape,
one kernel in Keras's step, are two kernels here, compiled twice. XLA's CPU
compile time grows with the kernels it compiles, so ViT-Base's first step
compiled about 420 kernels against Keras's 160.

Read at an index held in a variable, `gather(vector, index)`, the offset is a
runtime value: the kernels of one shape are one kernel again, their operands
differing only in the index buffer they receive. Every scale entry gets one
int32 scalar variable holding its own number, made with the optimizer's scale
variables (`ScaleState.build`) and never written; they are not part of the
optimizer's variables, nor of its checkpoints. The values read are the same,
bit for bit. `python -m benchmarks.profiles first_step --models vit_base`
measures the compile with and without them (its `constant_offsets` variant).
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf

from keras_als.step._early_build import made_eagerly


def make(count: int) -> tuple[tf.Variable, ...]:
    """`count` int32 scalar variables, the k-th holding k (never written).

    Made eagerly (`_early_build.made_eagerly`) even when the optimizer is
    built inside a traced step: a variable made inside a trace has its
    initializer lifted out of the graph, about 12 ms each (ViT-Base's 202
    took 2.4 s of its first step)."""
    with made_eagerly():
        return tuple(
            tf.Variable(k, dtype=tf.int32, trainable=False, name=f"keras_als_index_{k}")
            for k in range(count)
        )


def read_each(vector: tf.Tensor, indices: Sequence[tf.Variable]) -> tuple[tf.Tensor, ...]:
    """Every entry of the 1-D `vector`, the i-th read through the runtime
    index `indices[i]`; without indices (the first trace of a custom loop may
    run before the optimizer is built), at constant offsets."""
    if not indices:
        return tuple(tf.unstack(vector))
    size = vector.shape[0]
    return tuple(
        tf.gather(vector, indices[i]) if i < len(indices) else vector[i] for i in range(size)
    )
