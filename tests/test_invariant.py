"""The invariant: scaling never changes the mathematics.

Under the float32 policy every power-of-two scale is exact, so training with
keras_als (scales that differ per layer) must give the weights that training
without loss scaling gives, on every model shape.

Two checks, with and without XLA. Against the same wrapped model with every
scale 1, compiled the same way: equal to the bit. Against the plain, unwrapped
model (trained in a TensorFlow graph): relative difference at most 1e-5,
measured against the model's largest weight. The boundary ops change how
TensorFlow orders some reductions, which moves rounding by ~1e-7 per step; a
variable whose exact gradient is zero (the attention key bias, which softmax
ignores) holds only that rounding noise, which Adam turns into steps, so it
is measured on the model's scale. After these two epochs the Transformer
block with Adam differs by 1.1e-6 on one CPU of this workplace and by less
than 1e-6 on another: the bound leaves room for the CPU, while a scale left
out of the unscaling moves weights by whole orders of magnitude.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from benchmarks.harness.scaling import prebuild
from keras_als import policies
from tests import models

BATCH = 16


def _inner(name):
    return (
        keras.optimizers.SGD(0.05, momentum=0.5) if name == "sgd" else keras.optimizers.Adam(1e-2)
    )


def _train(model, optimizer, x, y, jit_compile=False):
    model.compile(optimizer=optimizer, loss=models.loss_for(model), jit_compile=jit_compile)
    prebuild(model)  # one trace of the step instead of two
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


def assert_same_weights(actual, expected, rtol=1e-5):
    assert len(actual) == len(expected)
    largest = max(np.max(np.abs(e)) for e in expected)
    for a, e in zip(actual, expected):
        assert np.max(np.abs(a - e)) / largest <= rtol


@pytest.mark.parametrize("inner", ["sgd", "adam"])
@pytest.mark.parametrize("shape", sorted(models.ALL_SHAPES))
def test_training_gives_the_weights_of_training_without_scaling(shape, inner):
    model, x, y = models.ALL_SHAPES[shape]()
    reference = _train(models.copy_of(model), _inner(inner), x, y)
    unscaled = keras_als.wrap_model(models.copy_of(model))  # same start, trained with scale 1

    wrapped = keras_als.wrap_model(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        _inner(inner), policy=models.per_layer_fixed(wrapped)
    )
    actual = _train(wrapped, optimizer, x, y)

    assert len(set(optimizer.layer_scales().values())) > 1, optimizer.layer_scales()
    assert int(optimizer.skipped_steps.numpy()) == 0
    assert int(optimizer.iterations.numpy()) == 2 * -(-len(x) // BATCH)
    assert_same_weights(actual, reference)

    ones = keras_als.AdaptiveLossScaleOptimizer(_inner(inner), policy=policies.Fixed(default=1.0))
    for a, e in zip(actual, _train(unscaled, ones, x, y)):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize(
    ("shape", "measure_every_n_steps", "inner"),
    [(shape, 1, inner) for shape in sorted(models.ALL_SHAPES) for inner in ("sgd", "adam")]
    + [("residual_cnn", 16, "adam"), ("transformer_block", 16, "adam")],
)
def test_layer_wise_scales_leave_the_weights_unchanged_under_xla(
    shape, measure_every_n_steps, inner
):
    """Adam under `MaxSafe`'s own scales; SGD under fixed scales that differ per
    layer, since with SGD `MaxSafe` can give some shapes one scale everywhere
    (the sequential MLP's, 2**13), which would check nothing layer-wise."""
    model, x, y = models.ALL_SHAPES[shape]()
    # The plain reference trains in a TensorFlow graph: XLA's rounding and the
    # graph's differ by about 2e-6 here (the Transformer block's), within the
    # bound, and the graph spares a compile of the step (7 s of the 28 s).
    reference = _train(models.copy_of(model), _inner(inner), x, y)
    unscaled = keras_als.wrap_model(models.copy_of(model))

    wrapped = keras_als.wrap_model(model)
    policy = "max_safe" if inner == "adam" else models.per_layer_fixed(wrapped)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        _inner(inner), policy=policy, measure_every_n_steps=measure_every_n_steps
    )
    actual = _train(wrapped, optimizer, x, y, jit_compile=True)

    assert len(set(optimizer.layer_scales().values())) > 1, optimizer.layer_scales()
    assert int(optimizer.skipped_steps.numpy()) == 0
    assert_same_weights(actual, reference)

    ones = keras_als.AdaptiveLossScaleOptimizer(
        _inner(inner),
        policy=policies.Fixed(default=1.0),
        measure_every_n_steps=measure_every_n_steps,
    )
    for a, e in zip(actual, _train(unscaled, ones, x, y, jit_compile=True), strict=True):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("inner", ["sgd", "adam"])
def test_a_scale_per_output_leaves_the_weights_of_training_without_scaling(inner):
    model, x, y = models.two_outputs()
    reference = _train(models.copy_of(model), _inner(inner), x, y)
    unscaled = keras_als.wrap_model(models.copy_of(model), scale_each_output=True)

    wrapped = keras_als.wrap_model(model, scale_each_output=True)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        _inner(inner), policy=models.per_layer_fixed(wrapped)
    )
    actual = _train(wrapped, optimizer, x, y)

    scales = optimizer.layer_scales()
    assert scales["first"] != scales["second"] != scales["loss"], scales
    assert_same_weights(actual, reference)
    ones = keras_als.AdaptiveLossScaleOptimizer(_inner(inner), policy=policies.Fixed(default=1.0))
    for a, e in zip(actual, _train(unscaled, ones, x, y)):
        np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("clip", ["clipnorm", "global_clipnorm"])
def test_the_inner_optimizer_clips_the_unscaled_gradients(clip):
    # docs/guide/custom_loops.md: to clip, give the inner optimizer `clipnorm`
    # or `global_clipnorm`; it sees the unscaled gradients. The bound is the
    # median of the plain model's gradient norms (or half their global norm),
    # so clipping binds on some variables (on all) and not on others: scaled
    # gradients would be clipped elsewhere (by other factors). Three steps: the
    # first runs at the first guess, one scale for all; then the policy's.
    model, x, y = models.sequential_mlp()
    x, y = x[: 3 * BATCH], y[: 3 * BATCH]
    plain = models.copy_of(model)
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(y[:BATCH], plain(x[:BATCH]))
    norms = [float(tf.norm(g)) for g in tape.gradient(loss, plain.trainable_variables)]
    if clip == "clipnorm":  # binds on half of the variables
        bound = float(np.median(norms))
        assert min(norms) < bound < max(norms)
    else:  # binds: half the global norm
        bound = 0.5 * float(np.linalg.norm(norms))

    before = plain.get_weights()
    plain.compile(optimizer=keras.optimizers.SGD(0.1, **{clip: bound}), loss="mse")
    plain.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    wrapped = keras_als.wrap_model(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.1, **{clip: bound}), policy=models.per_layer_fixed(wrapped)
    )
    wrapped.compile(optimizer=optimizer, loss="mse")
    wrapped.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)

    assert len(set(optimizer.layer_scales().values())) > 1, optimizer.layer_scales()
    assert int(optimizer.iterations.numpy()) == 3
    expected = [a - b for a, b in zip(plain.get_weights(), before, strict=True)]
    actual = [a - b for a, b in zip(wrapped.get_weights(), before, strict=True)]
    # The boundary ops reorder some float32 reductions (~1e-7 relative).
    assert_same_weights(actual, expected, rtol=1e-6)
