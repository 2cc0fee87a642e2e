"""A run that `Float32Fallback` changed resumes as it went: the layers it moved
to float32 are float32 again in a model rebuilt from code and restored from
a checkpoint, and training continues as the uninterrupted run's.

Neither weights files nor optimizer state hold a layer's dtype policy, so
the callback diagnoses again when a resumed `fit` begins (its first batch,
after `BackupAndRestore` restored the weights, wherever it is listed).
"""

import keras
import numpy as np
import pytest

import keras_als
from tests.test_raising_layers import AddsFloat32

EPOCHS, BATCH = 3, 8


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


def model_from_code():
    """Dense -> AddsFloat32 (its float16 call raises) -> Dense(float32), wrapped,
    compiled with keras_als's optimizer, the same weights each time."""
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(3)
    model = keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="tanh", name="first"),
                AddsFloat32(name="adds"),
                keras.layers.Dense(1, name="head", dtype="float32"),
            ]
        )
    )
    model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2)), "mse")
    return model


def _data():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(12 * BATCH, 4)).astype("float32")
    return x, np.tanh(x.sum(axis=1, keepdims=True)).astype("float32")


class Interrupt(keras.callbacks.Callback):
    """Raises once the optimizer has applied `step` updates."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if self.model.optimizer.iterations.numpy() == self.step:
            raise RuntimeError("interrupted")


def _float32_layers(model):
    return [layer.name for layer in model.layers if layer.compute_dtype == "float32"]


@pytest.mark.parametrize("fallback_first", [True, False])
def test_a_run_resumed_by_backup_and_restore_has_the_same_float32_layers_and_loss(
    tmp_path, fallback_first
):
    """Interrupted in the second epoch and resumed in a model rebuilt from
    code: `adds` computes in float32 again before the first resumed step (in
    float16 its call raises), and the weights and the last loss equal the
    uninterrupted run's within float32 rounding (measured: identical)."""
    x, y = _data()

    def fit(model, *callbacks):
        fallback = keras_als.Float32Fallback(x[:16], y[:16], verbose=False)
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        ordered = [fallback, backup] if fallback_first else [backup, fallback]
        history = model.fit(
            x,
            y,
            batch_size=BATCH,
            epochs=EPOCHS,
            verbose=0,
            shuffle=False,
            callbacks=[*ordered, *callbacks],
        )
        return fallback, history.history["loss"]

    uninterrupted = model_from_code()
    fallback = keras_als.Float32Fallback(x[:16], y[:16], verbose=False)
    expected = uninterrupted.fit(
        x, y, batch_size=BATCH, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[fallback]
    ).history["loss"]
    assert fallback.applied == [(0, ["adds"])]

    with pytest.raises(RuntimeError, match="interrupted"):
        fit(model_from_code(), Interrupt(17))  # in the second epoch
    resumed_model = model_from_code()  # a new process would build it so
    assert _float32_layers(resumed_model) == ["head"]
    resumed, losses = fit(resumed_model)
    assert resumed.applied == [(12, ["adds"])]  # at the start of the second epoch
    assert _float32_layers(resumed_model) == _float32_layers(uninterrupted) == ["adds", "head"]
    np.testing.assert_allclose(losses[-1], expected[-1], rtol=1e-6)
    for a, b in zip(resumed_model.get_weights(), uninterrupted.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert int(resumed_model.optimizer.skipped_steps.numpy()) == 0


def test_a_keras_file_keeps_the_float32_layers_and_a_weights_file_resumes_through_the_callback(
    tmp_path,
):
    """After one epoch with the callback: a `.keras` file holds each layer's
    dtype policy, so the loaded model computes `adds` in float32 as it is;
    a `.weights.h5` file does not, and a model rebuilt from code gets it
    back from the callback when its `fit` begins. Both then train one more
    epoch to the weights of the model that was saved (within float32
    rounding; measured: identical)."""
    x, y = _data()
    model = model_from_code()
    fallback = keras_als.Float32Fallback(x[:16], y[:16], verbose=False)
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[fallback])
    model.save(tmp_path / "model.keras")
    model.save_weights(tmp_path / "model.weights.h5")
    loaded = keras_als.wrap_model(
        keras.models.load_model(
            tmp_path / "model.keras", custom_objects={"AddsFloat32": AddsFloat32}
        )
    )
    assert _float32_layers(loaded) == ["adds", "head"]
    rebuilt = model_from_code()
    rebuilt.optimizer.build(rebuilt.trainable_variables)  # so that its state loads too
    rebuilt.load_weights(tmp_path / "model.weights.h5")
    assert _float32_layers(rebuilt) == ["head"]
    again = keras_als.Float32Fallback(x[:16], y[:16], verbose=False)
    rebuilt.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False, callbacks=[again])
    assert again.applied == [(12, ["adds"])]
    loaded.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    model.fit(x, y, batch_size=BATCH, verbose=0, shuffle=False)
    for other in (loaded, rebuilt):
        assert _float32_layers(other) == ["adds", "head"]
        for a, b in zip(other.get_weights(), model.get_weights(), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_resumed_keras_hub_t5_gets_its_float32_layers_back_and_trains_as_the_uninterrupted_run(
    tmp_path,
):
    """Tiny KerasHub T5 (its float16 loss is NaN whatever the weights), 3
    epochs of 8 steps under plain `fit` with `Float32Fallback` and
    `BackupAndRestore`, interrupted in the second epoch and resumed in a T5
    rebuilt from code: the resumed run moves the same layers to float32 at
    its first batch, skips no step, and ends at the uninterrupted run's loss
    and weights within float32 rounding (rtol 1e-5)."""
    from benchmarks.harness import hub_tasks

    sparse = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    x, y = hub_tasks.seq2seq_batches(64)
    first = {name: value[:8] for name, value in x.items()}

    def t5_from_code():
        keras.config.set_dtype_policy("mixed_float16")
        keras.utils.set_random_seed(0)
        model = keras_als.wrap_model(hub_tasks.t5_seq2seq_lm())
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
        model.compile(optimizer=optimizer, loss=sparse, jit_compile=True)
        return model

    def fit(model, *callbacks):
        fallback = keras_als.Float32Fallback(first, y[:8], loss=sparse, verbose=False)
        backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
        history = model.fit(
            x, y, batch_size=8, epochs=3, verbose=0, shuffle=False,
            callbacks=[fallback, backup, *callbacks],
        )  # fmt: skip
        return fallback, history.history["loss"]

    def float32_layers(model):
        layers = model._flatten_layers()  # positions: auto-generated names differ by instance
        return [i for i, layer in enumerate(layers) if layer.compute_dtype == "float32"]

    uninterrupted = t5_from_code()
    applied, expected = fit(uninterrupted)
    assert [step for step, _ in applied.applied] == [0]

    with pytest.raises(RuntimeError, match="interrupted"):
        fit(t5_from_code(), Interrupt(12))  # in the second epoch
    resumed_model = t5_from_code()
    assert float32_layers(resumed_model) != float32_layers(uninterrupted)
    resumed, losses = fit(resumed_model)
    assert resumed.applied == [(8, applied.applied[0][1])]  # the second epoch's start
    assert float32_layers(resumed_model) == float32_layers(uninterrupted)
    assert int(resumed_model.optimizer.skipped_steps.numpy()) == 0
    np.testing.assert_allclose(losses[-1], expected[-1], rtol=1e-5)
    for a, b in zip(resumed_model.get_weights(), uninterrupted.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
