"""`keras_als.calibrate`: every scale chosen from a float32 measurement before the first step.

Against closed forms (a Dense layer's largest gradient is known), against
training without it (float32: bit-identical), on the state it must leave
alone, and on KerasHub's Swin on canvases of exact zeros, whose first
gradients (1e15 in the patch embedding) overflow at the first guess.
"""

import keras
import numpy as np
import pytest

import keras_als
from tests import models, tasks


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


def _huge_model(policy="mixed_float16", kernel=1e4, inner=None):
    keras.config.set_dtype_policy(policy)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                4, name="huge", kernel_initializer=keras.initializers.Constant(kernel)
            ),
            keras.layers.Dense(1, name="head", dtype="float32"),
        ]
    )
    keras_als.wrap_model(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(inner or keras.optimizers.SGD(1e-12))
    model.compile(optimizer, "mse")
    x = np.ones((8, 4), "float32")
    return model, optimizer, x, np.zeros((8, 1), "float32")


def test_the_loss_scale_is_max_safe_s_closed_form_for_the_measured_gradient():
    # head(huge(x)) with all-ones input: huge's output is 4e4 per unit and
    # head's kernel is glorot; the loss's own gradient is 2 * y_pred / 1
    # (mse over 1 output, mean over 8 samples: d/dy_pred = 2 * y_pred / 8 each).
    model, optimizer, x, y = _huge_model("float32")
    y_pred = np.asarray(model(x), np.float64)
    head_kernel = np.asarray(model.get_layer("head").kernel, np.float64)
    # The loss component holds head's weight gradients: kernel 2/8 * sum(y_pred * h).
    hidden = np.full((8, 4), 4e4)
    largest = np.max(
        np.abs(np.concatenate([(2 / 8 * hidden.T @ y_pred).ravel(), [2 / 8 * y_pred.sum()]]))
    )
    scales = keras_als.calibrate(model, x, y)
    # MaxSafe(margin=6): the largest power of two s with largest * s * 2**6 <= 65504.
    expected = 2.0 ** np.floor(np.log2(65504 / (largest * 2**6)))
    assert scales["loss"] == min(expected, 2.0**15), (scales, largest)
    assert np.isfinite(head_kernel).all()


def test_after_it_the_first_step_applies_where_the_first_guess_would_skip():
    skipped = []
    for calibrated in (False, True):
        model, optimizer, x, y = _huge_model()
        if calibrated:
            keras_als.calibrate(model, x, y)
        model.fit(x, y, batch_size=8, epochs=3, verbose=0)
        skipped.append(int(optimizer.skipped_steps.numpy()))
    assert skipped[0] > 0, "the first guess 2**15 held: the test shows nothing"
    assert skipped[1] == 0, skipped


def test_it_changes_no_weight_slot_counter_moving_statistic_seed_or_metric():
    from tests.test_diagnosis import normalized_model

    model, x, y = normalized_model(wrapped=True)
    model.fit(x, y, batch_size=16, verbose=0)  # builds everything; Adam's slots move
    optimizer = model.optimizer
    kept = [*model.variables, *model.metrics_variables]
    kept += [v for v in optimizer.variables if v is not optimizer.scale_state]
    kept = [v for v in kept if v is not optimizer.dynamic_scale]
    assert any("seed_generator" in v.path for v in kept)
    before = [np.array(v.value) for v in kept]
    counters = np.array(optimizer.scaling.counters())
    policies = [(layer, layer.dtype_policy.name) for layer in model._flatten_layers()]
    keras_als.calibrate(model, x[:16], y[:16])
    assert all(layer.dtype_policy.name == name for layer, name in policies)
    for variable, value in zip(kept, before, strict=True):
        np.testing.assert_array_equal(np.array(variable.value), value, err_msg=variable.path)
    np.testing.assert_array_equal(np.array(optimizer.scaling.counters()), counters)


@pytest.mark.parametrize("shape", ["residual_cnn", "transformer_block"])
def test_in_float32_calibrated_training_is_bit_identical_to_training_without_it(shape):
    model, x, y = models.ALL_SHAPES[shape]()
    trained = []
    for calibrated in (False, True):
        copy = keras_als.wrap_model(models.copy_of(model))
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
        copy.compile(optimizer=optimizer, loss=models.loss_for(copy))
        if calibrated:
            before = optimizer.layer_scales()
            after = keras_als.calibrate(copy, x[:16], y[:16])
            assert after != {name: before["loss"] for name in after}, "nothing was chosen"
        copy.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0)
        trained.append(copy.get_weights())
    for a, b in zip(*trained, strict=True):
        np.testing.assert_array_equal(a, b)


def test_it_refuses_keras_s_optimizer_an_unbuilt_model_and_a_missing_loss():
    keras.config.set_dtype_policy("mixed_float16")
    x, y = np.ones((4, 4), "float32"), np.zeros((4, 1), "float32")
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    plain.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()), "mse")
    with pytest.raises(ValueError, match=r"keras_als.AdaptiveLossScaleOptimizer\(...\)"):
        keras_als.calibrate(plain, x, y)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam())
    with pytest.raises(ValueError, match="call it on a batch first"):
        keras_als.calibrate(keras.Sequential([keras.layers.Dense(1)]), x, y, optimizer=optimizer)
    uncompiled = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match="pass loss="):
        keras_als.calibrate(uncompiled, x, y, optimizer=optimizer)


@pytest.mark.slow
def test_on_swin_diagnosed_and_calibrated_keras_als_skips_no_step():
    """40 steps on the flat canvases: the diagnosed layers in float32 and the
    scales calibrated on the first batch, keras_als skips none (without
    calibration it skips the first 9, backing off from 2**15); Keras's
    optimizer skips 30."""
    x, y, model, optimizer, keras_skipped = tasks.swin_on_flat_canvases(steps=40, seed=5)
    keras_als.diagnose(model, x[:8], y[:8]).apply(model)
    model.compile(optimizer=optimizer, jit_compile=True)
    scales = keras_als.calibrate(model, x[:8], y[:8])
    assert scales["conv_projection"] < 2.0**-30, scales
    model.fit(x, y, batch_size=8, verbose=0, shuffle=False)
    assert int(optimizer.skipped_steps.numpy()) == 0 < keras_skipped
    assert all(np.isfinite(w).all() for w in model.get_weights())
