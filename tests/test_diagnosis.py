"""`keras_als.diagnose`: the layers float16 cannot hold, named, and float32 for them.

On KerasHub tasks built tiny from their constructors: Swin on canvases of
exact zeros (its patch embedding's gradients reach 1e14 in float32) and T5
(its attention's output is NaN in float16). The telemetry's runtime
counterpart is in test_float16_reports.py.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als.float32 import diagnosis

SPARSE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


def test_the_underflow_share_is_taken_at_the_largest_scale_that_holds_the_largest():
    # 1e10: scale 2**-18; 1.0 * 2**-18 is a normal float16, nothing flushes.
    share, largest = diagnosis._underflow_at_safe_scale(np.array([1e10, 1.0, 1.0, 0.0]))
    assert (share, largest) == (0.0, 1e10)
    # 1e14: scale 2**-31; 1e-3 * 2**-31 = 4.7e-13 is below 2**-25: 3 of 4 flush.
    share, _ = diagnosis._underflow_at_safe_scale(np.array([1e14, 1e-3, 1e-3, 1e-3]))
    assert share == 0.75
    assert diagnosis._underflow_at_safe_scale(np.zeros(3)) == (0.0, 0.0)


def _dense_model(kernel_value):
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(4, name="first"),
            keras.layers.Dense(
                4, name="huge", kernel_initializer=keras.initializers.Constant(kernel_value)
            ),
            keras.layers.Dense(2, name="head", dtype="float32"),
        ]
    )
    return model, np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")


def test_a_layer_whose_float16_output_overflows_is_named_and_float32_fixes_it():
    model, x, y = _dense_model(1e5)  # sums of 1e5 * O(1) exceed 65504
    found = keras_als.diagnose(model, x, y, loss=keras.losses.MeanSquaredError())
    assert found.layers == ["huge"] and found.findings[0].reason == "forward"
    assert "huge: its float16 output is not finite" in str(found)
    assert 'layer.dtype_policy = "float32"' in str(found)
    assert model.get_layer("huge").compute_dtype == "float16"  # diagnose changes nothing
    found.apply(model)
    assert model.get_layer("huge").compute_dtype == "float32"
    assert np.isfinite(np.asarray(model(x))).all()
    assert keras_als.diagnose(model, x, y, loss=keras.losses.MeanSquaredError()).layers == []


def test_a_float16_layer_whose_float32_input_overflows_in_its_cast_is_named():
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                4, dtype="float32", name="wide", kernel_initializer=keras.initializers.Constant(1e5)
            ),
            keras.layers.Dense(2, name="narrow"),
        ]
    )
    x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
    found = keras_als.diagnose(model, x, y, loss=keras.losses.MeanSquaredError())
    assert [(f.layer, f.reason) for f in found.findings] == [("narrow", "input")]
    assert "narrow: its input overflows float16 when cast to it" in str(found)
    with pytest.raises(ValueError, match="inputs x are not finite"):
        keras_als.diagnose(model, x * np.nan, y, loss=keras.losses.MeanSquaredError())


def test_a_model_float16_holds_is_reported_so():
    model, x, y = _dense_model(0.1)
    found = keras_als.diagnose(model, x, y, loss=keras.losses.MeanSquaredError())
    assert found.layers == []
    assert str(found) == "keras_als.diagnose: float16 holds every layer on this batch."


def test_diagnose_refuses_an_unbuilt_model_a_missing_loss_and_another_model_s_layers():
    model, x, y = _dense_model(0.1)
    with pytest.raises(ValueError, match="pass loss="):
        keras_als.diagnose(model, x, y)
    with pytest.raises(ValueError, match="built model"):
        keras_als.diagnose(keras.Sequential([keras.layers.Dense(2)]), x, y, loss="mse")
    found = diagnosis.Diagnosis((diagnosis.Finding("nowhere", "forward"),))
    with pytest.raises(ValueError, match="apply a diagnosis to the model it was made for"):
        found.apply(model)


def normalized_model(wrapped=True):
    """Dense, BatchNormalization, Dropout and a float32 head, compiled with
    keras_als (Adam 1e-3, mse); 64 normal samples."""
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(8, name="dense"),
            keras.layers.BatchNormalization(momentum=0.9, name="norm"),
            keras.layers.Dropout(0.5, name="dropout"),
            keras.layers.Dense(2, name="head", dtype="float32"),
        ]
    )
    if wrapped:
        keras_als.wrap_model(model)
        model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3)), "mse")
    else:
        model.compile(keras.optimizers.Adam(1e-3), "mse")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    return model, x, rng.normal(size=(64, 2)).astype("float32")


@pytest.mark.parametrize("wrapped", [False, True])
def test_diagnose_leaves_moving_statistics_dropout_s_seed_and_the_loss_tracker_as_they_were(
    wrapped,
):
    # Its forward passes run in training mode, which moves BatchNormalization's
    # statistics, draws Dropout's masks and (with the model's own loss) updates
    # the loss tracker; a diagnosis inside `fit` must not.
    model, x, y = normalized_model(wrapped)
    model.fit(x, y, batch_size=16, verbose=0)
    variables = [*model.variables, *model.metrics_variables]
    assert any("moving_mean" in v.path for v in variables)
    assert any("seed_generator" in v.path for v in variables)
    before = [np.array(v.value) for v in variables]
    assert keras_als.diagnose(model, x[:16], y[:16]).layers == []
    for variable, value in zip(variables, before, strict=True):
        np.testing.assert_array_equal(np.array(variable.value), value, err_msg=variable.path)


def _swin(wrapped):
    from benchmarks.flat_regions import models

    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(5)
    model = models.swin_classifier()
    if wrapped:
        keras_als.wrap_model(model)
    x, y = models.classification("train")
    return model, x[:8], y[:8]


@pytest.mark.slow
@pytest.mark.parametrize("wrapped", [False, True])
def test_diagnose_names_swin_s_patch_embedding_and_changes_nothing(wrapped):
    """Swin on canvases of exact zeros: its patch embedding's convolution and
    LayerNorm are named for their range (float32 gradients up to ~1e14, most of
    their other gradients flushed at a scale that holds those); weights,
    policies and the layers' `call` (keras_als's hooks where wrapped) are as
    before, with the task's own loss."""
    model, x, y = _swin(wrapped)
    before = [w.copy() for w in model.get_weights()]
    policies = [(layer, layer.dtype_policy.name) for layer in model._flatten_layers()]
    calls = [(layer, layer.__dict__.get("call")) for layer in model._flatten_layers()]
    found = keras_als.diagnose(model, x, y)
    names = found.layers
    assert names[:2] == ["patch_embedding/conv_projection", "patch_embedding/norm"], names
    first = found.findings[0]
    assert first.reason == "range" and first.largest > 1e10 and first.underflow_share > 0.1
    assert all(not name.startswith("stage_1") for name in names), names
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    assert all(layer.dtype_policy.name == name for layer, name in policies)
    assert all(layer.__dict__.get("call") is call for layer, call in calls)


def _lost_after_applying(reasons, weights, x, y, float32):
    """The share of the non-zero `float32` gradients on `(x, y)` that
    keras_als loses (zero or not finite) with the layers `diagnose` names for
    `reasons` in float32 and its scales calibrated, after 8 steps at learning
    rate 0 on that batch."""
    from benchmarks.flat_regions import mechanism

    model, _, _ = _swin(wrapped=True)
    model.set_weights(weights)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(0.0))
    model.compile(optimizer=optimizer, jit_compile=False)
    found = keras_als.diagnose(model, x, y)
    keras_als.Diagnosis(tuple(f for f in found.findings if f.reason in reasons)).apply(model)
    model.compile(optimizer=optimizer, jit_compile=False)
    keras_als.calibrate(model, x, y)
    model.fit(np.concatenate([x] * 8), np.concatenate([y] * 8), batch_size=8, verbose=0)
    got = mechanism.true_gradients(model, optimizer, x, y, jit_compile=False)
    return mechanism.lost_share(float32, got)


@pytest.mark.slow
def test_a_swin_block_whose_input_gradients_outrun_float16_is_named_and_then_none_are_lost():
    """Keras casts a float16 layer's inputs to float16 as they enter: a Swin
    block (and its stage) takes its residual stream so, and the gradients of
    1e10 flowing back into it pass through float16 even with every layer with
    weights inside it in float32. `diagnose` names those layers for their
    inputs ("input_range"); with them applied, keras_als loses under 0.1% of
    float32's non-zero gradients on the batch, and without them over 10%."""
    from benchmarks.flat_regions import mechanism, models

    model, x, y = _swin(wrapped=True)
    weights = model.get_weights()
    model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3)))
    found = keras_als.diagnose(model, x, y)
    by_input = [f.layer for f in found.findings if f.reason == "input_range"]
    assert {"stage_0", "stage_0/blocks_0"} <= set(by_input), found
    assert all(f.largest > 65504 and f.underflow_share > 0.01 for f in found.findings), found
    assert "the gradients into its input up to" in str(found)
    keras.config.set_dtype_policy("float32")
    reference = models.swin_classifier()
    reference.set_weights(weights)
    reference.compile(optimizer=keras.optimizers.Adam(0.0))
    float32 = mechanism.true_gradients(reference, reference.optimizer, x, y, jit_compile=False)
    assert _lost_after_applying({"range", "input_range"}, weights, x, y, float32) < 0.001
    assert _lost_after_applying({"range"}, weights, x, y, float32) > 0.1


def _shifted_window_swin():
    """A Swin with two blocks a stage, the second shifting its windows (so its
    attention adds a float16 mask to the scores), on letterboxed canvases:
    24-pixel canvases of exact zeros inside 4 pixels of zero padding."""
    from benchmarks.flat_regions import models

    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(1)
    model = models.swin_classifier(embed_dim=32, depths=(2, 2), patch_size=4)
    x, y = models.classification("train", side=24)
    return keras_als.wrap_model(model), np.pad(x[:16], [(0, 0), (4, 4), (4, 4), (0, 0)]), y[:16]


@pytest.mark.slow
def test_a_layer_that_adds_float16_to_a_named_layer_s_output_is_named_and_the_fix_trains():
    """On a Swin with shifted windows, a block's query-key-value projection in
    float32 alone would make the attention around it add float32 scores to
    its float16 mask (a dtype error in the traced step): the forward check
    names that attention ("mixed"). `diagnose` names the whole first stage
    for its input's range, so its mask is float32 too; with the diagnosis
    applied the step traces and trains, and `Float32Fallback` does the same
    when `fit` begins."""
    from keras_als.float32 import _forward_checks

    model, x, y = _shifted_window_swin()
    qkv = "stage_0/blocks_1/attn/attention_qkv"
    assert _forward_checks.mixing_layers(model, x[:8], [qkv]) == ["stage_0/blocks_1/attn"]
    model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3)))
    found = keras_als.diagnose(model, x[:8], y[:8])
    assert "stage_0" in found.layers and qkv in found.layers, found
    found.apply(model)
    model.compile(
        keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3)), jit_compile=False
    )
    losses = model.fit(x, y, batch_size=8, verbose=0, shuffle=False).history["loss"]
    assert np.isfinite(losses).all(), losses

    fresh, _, _ = _shifted_window_swin()
    fresh.compile(
        keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3)), jit_compile=False
    )
    fallback = keras_als.Float32Fallback(x[:8], y[:8], verbose=False)
    fresh.fit(x, y, batch_size=8, verbose=0, shuffle=False, callbacks=[fallback])
    step, layers = fallback.applied[0]
    assert step == 0 and "stage_0" in layers, fallback.applied


def _trained_loss(model, optimizer, x, y, steps):
    model.compile(optimizer=optimizer, jit_compile=True)
    model.fit(x[: 8 * steps], y[: 8 * steps], batch_size=8, verbose=0, shuffle=False)
    return model.evaluate(x[-256:], y[-256:], batch_size=64, verbose=0, return_dict=True)["loss"]


@pytest.mark.slow
def test_with_the_diagnosed_layers_in_float32_keras_als_trains_swin_as_float32_does():
    """200 steps of Adam 1e-3 on the flat canvases, the same weights and
    batches: keras_als with `diagnose(...).apply` ends within 0.03 of the
    float32 model's held-out loss and skips no more steps than Keras's
    `LossScaleOptimizer`; without the fix, Keras's own scale ends farther."""
    from benchmarks.flat_regions import models

    x, y = models.classification("train")
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(5)
    reference = models.swin_classifier()
    weights = reference.get_weights()
    float32 = _trained_loss(reference, keras.optimizers.Adam(1e-3), x, y, 200)

    model, first_x, first_y = _swin(wrapped=True)
    model.set_weights(weights)
    keras_als.diagnose(model, first_x, first_y).apply(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    ours = _trained_loss(model, optimizer, x, y, 200)

    plain, _, _ = _swin(wrapped=False)
    plain.set_weights(weights)
    keras_optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    _trained_loss(plain, keras_optimizer, x, y, 200)
    keras_skipped = 200 - int(keras_optimizer.iterations.numpy())

    skipped = int(optimizer.skipped_steps.numpy())
    print(f"held-out loss: float32 {float32:.4f}, diagnosed {ours:.4f}; skipped {skipped}")
    assert abs(ours - float32) < 0.03, (ours, float32)
    assert int(optimizer.skipped_steps.numpy()) <= keras_skipped


@pytest.mark.slow
def test_diagnose_names_t5_s_attention_whose_float16_output_is_nan_and_the_fix_trains():
    """T5 under mixed_float16: its loss is NaN from the first step (the
    padding mask's -1e9 is -inf in float16). `diagnose` names the encoder's and
    decoder's self-attention and the cross-attention that a finite upstream
    output then exposes; with them in float32, keras_als trains it: every
    step applied, the loss finite and falling."""
    from benchmarks.harness import hub_tasks

    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    model = keras_als.wrap_model(hub_tasks.t5_seq2seq_lm())
    x, y = hub_tasks.seq2seq_batches(64)
    first = tf.nest.map_structure(lambda a: a[:8], x)
    assert not np.isfinite(np.asarray(model(first, training=True), np.float32)).all()
    found = keras_als.diagnose(model, first, y[:8], loss=SPARSE)
    assert found.layers == [
        "transformer_encoder_layer_0/self_attention",
        "transformer_decoder_layer_0/self_attention",
        "transformer_decoder_layer_0/cross_attention",
    ]
    assert all(f.reason == "forward" for f in found.findings)
    found.apply(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=optimizer, loss=SPARSE, jit_compile=True)
    losses = model.fit(x, y, batch_size=8, epochs=3, verbose=0).history["loss"]
    assert np.isfinite(losses).all() and losses[-1] < losses[0], losses
    assert int(optimizer.skipped_steps.numpy()) == 0
