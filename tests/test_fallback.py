"""`keras_als.Float32Fallback`: during `fit`, the layers float16 cannot hold go to float32.

On a Dense layer whose float16 output overflows (every step is skipped until
the fallback acts) and on KerasHub's Swin on canvases of exact zeros (its
patch embedding's gradients reach 1e15), against Keras's `LossScaleOptimizer`
on the same weights and batches.
"""

import keras
import numpy as np
import pytest

import keras_als
from keras_als.float32 import fallback as fallback_module
from tests import tasks


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


def _dense_model(kernel_value):
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                4, name="huge", kernel_initializer=keras.initializers.Constant(kernel_value)
            ),
            keras.layers.Dense(
                4, name="after", kernel_initializer=keras.initializers.Constant(1 / kernel_value)
            ),
            keras.layers.Dense(2, name="head", dtype="float32"),
        ]
    )
    keras_als.wrap_model(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer, "mse")
    rng = np.random.default_rng(0)
    x = rng.uniform(0.5, 1.5, (64, 4)).astype("float32")
    return model, optimizer, x, np.zeros((64, 2), "float32")


def test_when_fit_begins_it_moves_the_overflowing_layer_to_float32_and_no_step_is_skipped():
    model, optimizer, x, y = _dense_model(1e5)  # sums of 1e5 * O(1) exceed 65504
    fallback = keras_als.Float32Fallback(x[:8], y[:8], verbose=False)
    model.fit(x, y, batch_size=4, verbose=0, shuffle=False, callbacks=[fallback])
    # "after" takes huge's float32 output, 4e5, which its cast to float16 overflows.
    assert fallback.applied == [(0, ["huge", "after"])]
    assert [layer.compute_dtype for layer in model.layers] == ["float32"] * 3
    assert int(optimizer.skipped_steps.numpy()) == 0
    assert int(optimizer.iterations.numpy()) == 16
    assert np.isfinite(model.evaluate(x, y, verbose=0))


def test_a_layer_whose_float16_output_overflows_goes_to_float32_and_every_later_step_applies():
    model, optimizer, x, y = _dense_model(1e5)  # sums of 1e5 * O(1) exceed 65504
    fallback = keras_als.Float32Fallback(
        x[:8], y[:8], skipped_in_a_row=3, verbose=False, at_start=False
    )
    model.fit(x, y, batch_size=4, verbose=0, shuffle=False, callbacks=[fallback])
    # "after" takes huge's float32 output, 4e5, which its cast to float16 overflows.
    assert fallback.applied == [(3, ["huge", "after"])]
    assert [layer.compute_dtype for layer in model.layers] == ["float32"] * 3
    # The three steps before it were skipped; the 13 after it all applied.
    assert int(optimizer.skipped_steps.numpy()) == 3
    assert int(optimizer.iterations.numpy()) == 16 - 3
    assert all(np.isfinite(w).all() for w in model.get_weights())
    assert np.isfinite(model.evaluate(x, y, verbose=0))


def test_it_reads_the_skip_counter_before_each_batch_and_leaves_fit_s_async_logs_on():
    # A callback with its own on_train_batch_end makes fit convert every
    # batch's logs on the host; the fallback checks before the next batch.
    default = keras.callbacks.Callback.on_train_batch_end
    assert keras_als.Float32Fallback.on_train_batch_end is default
    model, optimizer, x, y = _dense_model(1e5)
    assert optimizer.skipped_step_count() == 0  # before build
    model.fit(x[:12], y[:12], batch_size=4, verbose=0)  # every step overflows
    assert optimizer.skipped_step_count() == 3
    assert optimizer.scaling.counter_value("skipped_in_a_row") == 3
    assert int(optimizer.skipped_steps.numpy()) == 3


def test_where_float16_holds_it_diagnoses_once_at_the_start_and_changes_no_layer(monkeypatch):
    calls = []
    real = fallback_module.diagnosed_with
    monkeypatch.setattr(
        fallback_module, "diagnosed_with", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    model, optimizer, x, y = _dense_model(0.1)
    fallback = keras_als.Float32Fallback(x[:8], y[:8])
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[fallback])
    assert int(optimizer.skipped_steps.numpy()) == 0  # calibrated: no first guess to back off
    assert fallback.applied == [] and len(calls) == 1
    assert model.get_layer("huge").compute_dtype == "float16"
    model.fit(x, y, batch_size=4, verbose=0, callbacks=[fallback])  # trained: no start again
    assert len(calls) == 1


def test_a_diagnosis_that_finds_nothing_leaves_training_bit_identical(monkeypatch):
    # BatchNormalization's moving statistics and Dropout's masks would move
    # if the diagnosis's forward passes in training mode were kept.
    from tests.test_diagnosis import normalized_model

    calls = []
    real = fallback_module.diagnosed_with

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(fallback_module, "diagnosed_with", counted)
    trained = []
    for with_fallback in (False, True):
        model, x, y = normalized_model()
        callbacks = [keras_als.Float32Fallback(x[:16], y[:16], skipped_in_a_row=1, at_start=False)]
        callbacks = callbacks if with_fallback else []
        model.fit(x, y, batch_size=4, verbose=0, shuffle=False, callbacks=callbacks)
        trained.append([np.array(v.value) for v in model.variables])
    assert calls, "no step was skipped, so nothing was diagnosed"
    for after_plain, after_fallback in zip(*trained, strict=True):
        np.testing.assert_array_equal(after_fallback, after_plain)


def test_it_stops_after_its_rounds_and_refuses_keras_s_optimizer_and_bad_arguments():
    model, optimizer, x, y = _dense_model(1e5)
    fallback = keras_als.Float32Fallback(x[:8], y[:8], skipped_in_a_row=1, rounds=1)
    fallback._diagnoses = 1  # as if this fit had diagnosed already
    fallback.set_model(model)
    fallback.on_train_batch_begin(1)
    assert fallback.applied == []
    with pytest.raises(ValueError, match="whole numbers >= 1"):
        keras_als.Float32Fallback(x, y, skipped_in_a_row=0)
    keras.config.set_dtype_policy("mixed_float16")
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    plain.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam()), "mse")
    with pytest.raises(ValueError, match=r"keras_als.AdaptiveLossScaleOptimizer\(...\)"):
        plain.fit(x, y, verbose=0, callbacks=[keras_als.Float32Fallback(x, y)])


@pytest.mark.slow
def test_on_swin_it_moves_the_patch_embedding_to_float32_and_skips_fewer_steps_than_keras():
    """40 steps of Adam 1e-3 on the flat canvases, the same weights and
    batches: keras_als with the fallback sets the patch embedding (and the
    first block, whose gradients span as much) to float32 when `fit` begins,
    calibrates the scales, and skips at most 2 steps (none on this machine;
    without calibration 9), Keras's optimizer 30 (halving its scale from
    2**15)."""
    x, y, model, optimizer, keras_skipped = tasks.swin_on_flat_canvases(steps=40, seed=5)
    fallback = keras_als.Float32Fallback(x[:8], y[:8], verbose=False)
    model.fit(x, y, batch_size=8, verbose=0, shuffle=False, callbacks=[fallback])
    skipped = int(optimizer.skipped_steps.numpy())
    print(f"skipped: keras_als with the fallback {skipped}, Keras {keras_skipped}")
    [(step, layers)] = fallback.applied
    assert step == 0
    assert layers[:2] == ["patch_embedding/conv_projection", "patch_embedding/norm"], layers
    assert skipped <= 2 and skipped < keras_skipped, (skipped, keras_skipped)
    assert all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.slow
def test_on_t5_whose_float16_loss_is_nan_it_trains_to_float32_s_loss_with_no_step_skipped():
    """Tiny KerasHub T5, 24 steps of Adam 1e-3 under plain `fit`: float32's
    per-epoch losses and keras_als's with the fallback agree within 1e-4
    relative (measured 7e-7: 5.43699 and 5.43700), every step applied;
    without the callback every step is skipped (test_stuck_warning.py)."""
    from benchmarks.harness import hub_tasks

    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = hub_tasks.seq2seq_batches(64)
    keras.utils.set_random_seed(0)
    reference = hub_tasks.t5_seq2seq_lm()
    reference.compile(optimizer=keras.optimizers.Adam(1e-3), loss=sparse, jit_compile=True)
    expected = reference.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False)
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    model = keras_als.wrap_model(hub_tasks.t5_seq2seq_lm())
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=optimizer, loss=sparse, jit_compile=True)
    first = {name: value[:8] for name, value in x.items()}
    fallback = keras_als.Float32Fallback(first, y[:8], loss=sparse, verbose=False)
    losses = model.fit(x, y, batch_size=8, epochs=3, verbose=0, shuffle=False, callbacks=[fallback])
    assert [step for step, _ in fallback.applied] == [0]
    assert int(optimizer.skipped_steps.numpy()) == 0
    np.testing.assert_allclose(losses.history["loss"], expected.history["loss"], rtol=1e-4)
