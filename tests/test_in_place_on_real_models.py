"""The README's promises about instrumenting in place, on models as users hold them.

KerasHub tasks and keras.applications classifiers with their own top, built
tiny from their constructors (`tests/tasks.py`; no download):

- weights saved from the plain model load by path into the instrumented one;
- wrapping twice is wrapping once, and `unwrap_model` removes every boundary:
  a traced call is the plain model's;
- a layer's `dtype_policy`, set before or after `wrap_model`, is the one it
  computes in, and one step's unscaled gradients stay the plain model's.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als.instrument import hook_of
from tests import models, tasks

pytest.importorskip("keras_hub")


def _batch(name, size=8):
    """The first `size` examples of the data model `name` trains on, as tensors."""
    x, y = tasks.data(name)
    return tf.nest.map_structure(lambda a: tf.constant(a[:size]), (x, y))


def _traced_call(model, x):
    """`model`'s outputs on `x` through a traced call (the boundaries exist only
    in traced functions), and how many ops of each type its graph holds."""
    call = tf.function(lambda x: model(x, training=False))
    outputs = [np.asarray(o) for o in tf.nest.flatten(call(x))]
    graph = call.get_concrete_function(x).graph
    return outputs, collections.Counter(op.type for op in graph.get_operations())


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(tasks.MODELS))
def test_plain_weights_load_by_path_and_unwrap_model_gives_back_the_plain_program(name, tmp_path):
    """The plain model's weights, saved to a `.weights.h5` file, load into the
    instrumented model built under another seed: every weight, in order,
    equals the plain model's of the same path, and traced outputs equal the
    plain model's within float32 rounding (1e-6); wrapped a second time, its
    traced call has the same ops as after the first. `unwrap_model` then removes
    every boundary: no layer at any depth keeps its hook, and a traced call
    has the plain model's ops, type for type, and its outputs, bit for bit."""
    x, _ = _batch(name)
    plain = tasks.build(name)
    path = str(tmp_path / "plain.weights.h5")
    plain.save_weights(path)
    expected, plain_ops = _traced_call(plain, x)

    keras.utils.clear_session(free_memory=False)  # as a new process: the same layer names
    model = keras_als.wrap_model(tasks.build(name, seed=1))
    assert any(not np.array_equal(a, b) for a, b in zip(model.weights, plain.weights))
    model.load_weights(path)
    for a, b in zip(model.weights, plain.weights, strict=True):
        assert a.path == b.path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=a.path)
    outputs, ops = _traced_call(model, x)
    for a, e in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=1e-6, atol=1e-6)
    assert ops != plain_ops  # the boundaries are in the instrumented call
    assert keras_als.wrap_model(model) is model
    assert _traced_call(model, x)[1] == ops  # wrapping twice is wrapping once

    assert keras_als.unwrap_model(model) is model
    assert all(hook_of(layer) is None for layer in model._flatten_layers())
    outputs, ops = _traced_call(model, x)
    assert ops == plain_ops
    for a, e in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(a, e)


HEAD = "predictions"
"""The classifier head of MobileNetV2 and ViT: the layer Keras's mixed
precision guide has users compute in float32."""

# MobileNetV2's float16 convolutions in a TensorFlow graph make each of its
# cases take 40 s on 2 cores: it runs the order that changes a policy under
# the boundaries already placed; ViT runs both.
ORDERS = [("mobilenet_v2", "after"), ("vit_classifier", "before"), ("vit_classifier", "after")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "order"), ORDERS)
def test_a_head_set_to_float32_before_or_after_wrapping_keeps_the_plain_gradients(name, order):
    """Under mixed_float16, the head's `dtype_policy` set to float32 before or
    after `wrap_model`: the head computes in float32 and keeps its scale; one
    traced step's unscaled gradients, at scales from 2**8 to 2**14 that differ
    from layer to layer, are as near the float32 model's (same weights and
    batch) as the plain float16 model's (its head float32 too, its loss scaled
    by 2**8: at 2**12 the first convolutions' float16 gradients in MobileNetV2
    overflow), within 10% of the plain model's error plus float16's precision
    (`models.assert_as_near_float32_as_plain`). The plain float16 gradients are
    no reference: in MobileNetV2 (BatchNorm in training mode) they lie 40-60%
    from float32's, so rounding that differs from one CPU's kernels to
    another's moves keras_als's and theirs apart by more than float16's
    precision."""
    x, y = _batch(name)
    model = tasks.build(name, "mixed_float16")
    plain = tasks.build(name, "mixed_float16")
    plain.set_weights(model.get_weights())
    plain.get_layer(HEAD).dtype_policy = "float32"
    reference = tasks.build(name, "float32")
    reference.set_weights(model.get_weights())
    head = model.get_layer(HEAD)
    if order == "before":
        head.dtype_policy = "float32"
    keras_als.wrap_model(model)
    if order == "after":
        head.dtype_policy = "float32"
    assert head.compute_dtype == "float32"

    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.0), policy=models.per_layer_fixed_in_float16(model)
    )
    tasks.compile_with(model, name, optimizer)
    for _ in range(2):  # the policy sets its scales on the first steps (learning rate 0)
        model.train_on_batch(x, y)
    assert len(set(optimizer.layer_scales().values())) > 2, optimizer.layer_scales()
    assert head.name in optimizer.layer_scales()

    def loss_of(m):
        logits = m(x, training=True)
        assert logits.dtype == "float32"
        return tasks.SPARSE(y, logits)

    got = models.traced_gradients(model, loss_of, optimizer)
    want = models.traced_gradients(plain, loss_of, scale=2.0**8)
    exact = models.traced_gradients(reference, loss_of)
    variables = model.trainable_variables
    worst = models.assert_as_near_float32_as_plain(got, want, exact, variables)
    print(f"{name}, {order}: worst error / bound, keras_als vs float32: {worst:.2e}")
