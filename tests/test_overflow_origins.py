"""Overflows in a transformer's residual stream, whose components feed each other.

The residual stream of a transformer is one scale component (its joins share
a scale); it feeds each branch and each branch's output joins it again, so
the components lie on cycles. An overflow there must still have an origin
(`keras_als.policies.overflow_origins`), or it teaches no headroom and recurs
each time a measurement raises the scales. On KerasHub's Swin on canvases of
exact zeros (flat patches make its LayerNorms amplify gradients ~300-fold),
against Keras's `LossScaleOptimizer` on the same weights and batches.
"""

import warnings

import keras
import numpy as np
import pytest

from tests import tasks


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


STEPS = 120


@pytest.fixture(scope="module")
def swin():
    """keras_als alone trained `STEPS` steps on Swin: its initial weights,
    model, optimizer, the warnings of `fit` and Keras's skipped steps."""
    x, y, model, optimizer, keras_skipped = tasks.swin_on_flat_canvases(STEPS, seed=1)
    initial = {v.path: v.numpy() for v in model.weights}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, verbose=0, shuffle=False)
    yield initial, model, optimizer, [str(w.message) for w in caught], keras_skipped
    keras.config.set_dtype_policy("float32")


@pytest.mark.slow
def test_on_swin_overflows_in_the_residual_stream_teach_headroom_and_stop_recurring(swin):
    """120 steps of Adam 1e-3: keras_als alone skips no more steps than Keras's
    optimizer (which skips 30 or so while halving its scale from 2**15). Before
    overflows on cycles had an origin, keras_als skipped every other step from
    step 10 on (about 65 of 120): each measurement at the floor, where the
    stream's gradients flush to zero, raised its scale 36 binades, into the
    next overflow."""
    _, model, optimizer, _, keras_skipped = swin
    telemetry = optimizer.telemetry()
    skipped = telemetry["skipped_steps"]
    print(f"skipped: keras_als {skipped}, Keras {keras_skipped}")
    assert skipped <= keras_skipped, (skipped, keras_skipped)
    stream = "stage_0/blocks_0/norm1"  # a join of the residual stream
    assert telemetry["overflows"][stream] > 0 and telemetry["headroom"][stream] > 0
    last_overflow = max(telemetry["last_overflow_step"].values())
    assert last_overflow < STEPS - 50, last_overflow  # none recurs in the last 50 steps
    assert all(np.isfinite(w).all() for w in model.get_weights())


@pytest.mark.slow
def test_on_swin_fit_names_the_layers_float16_cannot_train_and_the_float32_fix(swin):
    """Without a ScaleMonitor: at the scale that keeps the stream finite its
    gradients flush to zero whole, so the backbone's weights never change.
    The warning at the end of `fit` and `telemetry()["needs_float32"]` name
    those layers, the patch embedding first; the head, which trains, is not named."""
    initial, model, optimizer, said, _ = swin
    telemetry = optimizer.telemetry()
    needs = telemetry["needs_float32"]
    assert needs[0] == "conv_projection" and "stage_0/blocks_0/norm1" in needs, needs
    assert "predictions" not in needs and "norm" not in needs, needs
    for name in needs:
        assert telemetry["underflow_rate"][name] == 1.0 and telemetry["scale"][name] < 1.0
    # What the warning says is true: the patch embedding's weights did not move,
    # the head's did.
    now = {v.path: v.numpy() for v in model.weights}
    kernel, head = "patch_embedding/conv_projection/kernel", "predictions/kernel"
    assert np.array_equal(now[kernel], initial[kernel])
    assert not np.array_equal(now[head], initial[head])
    warning = [m for m in said if "float16 loses the gradients of conv_projection" in m]
    assert len(warning) == 1, said
    assert 'layer.dtype_policy = "float32"' in warning[0] and "Float32Fallback" in warning[0]
