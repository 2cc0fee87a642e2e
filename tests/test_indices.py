"""`_indices`: each component's scale read through a runtime index, so that
XLA compiles one kernel for the updates (and the rescalings) of layers of one
shape, as in Keras's step, and the values read are the same bits."""

import keras
import numpy as np
import tensorflow as tf

import keras_als
from benchmarks.harness import ablations
from benchmarks.harness.xla_step import compiled_step
from benchmarks.profiles.first_step import kernels
from keras_als.step import _indices


def test_each_entry_is_read_through_its_index_variable_or_else_at_a_constant_offset():
    vector = tf.constant([1.0, 2.0, 4.0])
    indices = _indices.make(4)
    assert [int(k.numpy()) for k in indices] == [0, 1, 2, 3]
    assert not any(k.trainable for k in indices)
    for given in (indices, ()):
        assert [float(v) for v in _indices.read_each(vector, given)] == [1.0, 2.0, 4.0]

    @tf.function
    def kinds(given):
        return [v.op.type for v in _indices.read_each(vector, given)]

    assert kinds(indices) == ["GatherV2"] * 3
    assert kinds(()) == ["Unpack"] * 3


def _model() -> keras.Model:
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(16, activation="tanh") for _ in range(6)]
    return keras_als.wrap_model(
        keras.Sequential([keras.Input((16,)), *layers, keras.layers.Dense(1)])
    )


def _one_step(constant_offsets: bool):
    """The weights after one compiled SGD step in float32, the optimized
    program's (fusions, distinct kernels), and the number of scales."""
    model = _model()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.1), initial_scale=2.0**10
    )
    optimizer.build(model.trainable_variables)
    step = compiled_step(model, optimizer, keras.losses.MeanSquaredError())
    x = np.random.default_rng(1).normal(size=(8, 16)).astype("float32")
    y = np.ones((8, 1), "float32")
    with ablations.constant_offsets() if constant_offsets else ablations.named(""):
        program = step.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
        step(x, y)
    return [w.numpy() for w in model.trainable_weights], kernels(program), optimizer.layer_scales()


def test_layers_of_one_shape_share_their_update_kernels_and_train_to_the_same_bits():
    """Six Dense(16) layers, each its own scale: read at constant offsets, each
    layer's update (and rescaling) is a kernel of its own; read through the
    runtime indices, they are shared. One step gives the same weights, bit for bit."""
    weights, (fusions, distinct), scales = _one_step(constant_offsets=False)
    offset_weights, (offset_fusions, offset_distinct), _ = _one_step(constant_offsets=True)
    assert len(scales) == 8 and len(set(scales.values())) > 1, scales  # the loss and 7 layers
    # 74 distinct kernels against 84 (TensorFlow 2.21): the updates and rescalings shared
    assert distinct <= offset_distinct - 8, (distinct, offset_distinct, fusions, offset_fusions)
    for a, b in zip(weights, offset_weights):
        np.testing.assert_array_equal(a, b)


def test_the_index_variables_are_not_the_optimizers_variables_nor_in_its_checkpoints(tmp_path):
    model = _model()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    optimizer.build(model.trainable_variables)
    assert len(optimizer.scaling.indices) == len(model.trainable_variables) + 1
    assert not any("keras_als_index" in v.path for v in optimizer.variables)
    path = str(tmp_path / "checkpoint")
    saved = tf.train.Checkpoint(optimizer=optimizer).write(path)
    names = [name for name, _ in tf.train.list_variables(saved)]
    assert names and not any("index" in name for name in names), names
