"""A model instrumented in place, against its plain twin: the checks the tests
of real models and KerasHub tasks share."""

import keras
import numpy as np
import tensorflow as tf

import keras_als
from benchmarks.harness.scaling import prebuild
from benchmarks.real_models import architectures
from tests import models


def outputs(model, x):
    """`model`'s outputs on `x` through a traced call: the boundaries exist
    only in traced functions, so an eager call would not run through them."""
    return keras.ops.convert_to_numpy(tf.function(lambda x: model(x, training=False))(x))


def twice(build):
    """Two models from `build()`, built under the same seed, the second given
    the first's weights: (the one to instrument, its plain reference)."""
    keras.utils.set_random_seed(0)
    model = build()
    keras.utils.set_random_seed(0)
    plain = build()
    plain.set_weights(model.get_weights())
    return model, plain


def wrap_in_place(model):
    """`wrap_model(model)`, checked to keep every weight object, path and order,
    the model's class and its config."""
    before, weights = models.description(model), list(model.weights)
    assert keras_als.wrap_model(model) is model
    assert models.description(model) == before
    assert all(a is b for a, b in zip(model.weights, weights, strict=True))
    return model


def assert_same_outputs(model, plain, x):
    """Traced outputs of the instrumented model equal the plain one's within
    float32 rounding (1e-6 relative: the boundaries' identity ops can change
    how TensorFlow fuses the graph), and every layer with trainable weights of
    its own, nested ones included, has a scale name."""
    np.testing.assert_allclose(outputs(model, x), outputs(plain, x), rtol=1e-6, atol=1e-6)
    assert len(models.scale_names(model)) == len(models.scaled_layers(model))


def train(model, optimizer, x, y, steps, jit_compile=True):
    """`steps` steps of `model.train_on_batch` on consecutive batches of the real
    models' size (`architectures.BATCH`), with sparse cross-entropy."""
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=jit_compile,
    )
    prebuild(model)  # one trace of the step instead of two
    assert len(y) >= steps * architectures.BATCH, "fewer batches than steps"
    for i in range(steps):
        model.train_on_batch(
            architectures.batch(x, i), y[i * architectures.BATCH :][: architectures.BATCH]
        )
