"""What the telemetry and its warnings say about layers float16 cannot hold:
`beyond_float16`, `needs_float32` and the fix they name, and the
mixed_bfloat16 warning (`keras_als.diagnose` is in test_diagnosis.py)."""

import warnings

import keras
import numpy as np
import pytest

import keras_als
from keras_als.step import _scale_state, _state
from keras_als.telemetry import _telemetry


@pytest.fixture(autouse=True)
def _float32_after():
    yield
    keras.config.set_dtype_policy("float32")


def _numbers(scale, overflows, in_a_row=0):
    return {
        "scale": scale,
        "overflows": overflows,
        "last_overflow_step": {n: 90 if overflows.get(n) else -1 for n in scale},
        "skipped_in_a_row": in_a_row,
        "recent_skip_rate": 0.0,
        "steps": 100,
    }


def test_layers_that_overflowed_below_scale_one_are_beyond_float16_and_the_warning_says_the_fix():
    telemetry = _numbers(
        {"loss": 2.0**-3, "patch": 2.0**-20, "block": 2.0**-2, "head": 2.0**10},
        {"loss": 5, "patch": 12, "block": 0, "head": 3},
    )
    # The loss is no layer; "block" never overflowed; "head" did at a scale above 1.
    assert _telemetry.beyond_float16(telemetry) == ["patch"]
    telemetry["beyond_float16"] = ["patch"]
    telemetry["skipped_in_a_row"] = 30
    message = _telemetry.stuck(telemetry, in_a_row_limit=20)
    assert (
        "Gradients beyond float16's range (they overflowed at scales below 1) in: patch." in message
    )
    assert 'layer.dtype_policy = "float32"' in message and "keras_als.diagnose" in message
    assert "keras_als.Float32Fallback(x, y)" in message
    telemetry["beyond_float16"] = []
    assert "beyond float16" not in _telemetry.stuck(telemetry, in_a_row_limit=20)


def test_layers_beyond_float16_whose_gradients_also_underflow_need_float32():
    telemetry = _numbers(
        {"loss": 2.0**-3, "patch": 2.0**-24, "head": 2.0**-10, "block": 2.0**-24},
        {"loss": 5, "patch": 12, "head": 3, "block": 0},
    )
    telemetry["underflow_rate"] = {"loss": 1.0, "patch": 1.0, "head": 0.2, "block": 1.0}
    telemetry["beyond_float16"] = _telemetry.beyond_float16(telemetry)
    # "head" overflowed below scale 1 but float16 holds its small gradients at
    # that scale; "block" underflows but never overflowed (a scale can rise there).
    assert telemetry["beyond_float16"] == ["patch", "head"]
    assert _telemetry.needs_float32(telemetry) == ["patch"]
    telemetry["underflow_rate"]["head"] = _telemetry.LOST_SHARE
    assert _telemetry.needs_float32(telemetry) == ["patch", "head"]
    # A layer computing in float32 already is not told to: that is no fix.
    assert _telemetry.needs_float32(telemetry, in_float32=["patch"]) == ["head"]


def test_telemetry_leaves_layers_already_computing_in_float32_out_of_needs_float32():
    inputs = keras.Input((4,))
    patch = keras.layers.Dense(4, name="patch", dtype="mixed_float16")
    head = keras.layers.Dense(1, name="head", dtype="float32")
    model = keras_als.wrap_model(keras.Model(inputs, head(patch(inputs))))
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    optimizer.build(model.trainable_variables)
    # Both layers' state as a layer float16 cannot hold: overflows at 2**-24, all underflowing.
    table = optimizer.scaling.table().numpy()
    for name, value in [("scale", 2.0**-24), ("overflow_counts", 12), ("underflow_rates", 1.0)]:
        table[_state.PER_SCALE.index(name), 1:] = value
    optimizer.scaling.assign(table)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the needs-float32 warning: tested above
        telemetry = optimizer.telemetry()
    assert telemetry["beyond_float16"] == ["patch", "head"]
    assert telemetry["needs_float32"] == ["patch"]


def test_the_needs_float32_warning_names_the_layers_and_the_fix_once_and_not_when_stuck():
    telemetry = _numbers({"loss": 1.0, "patch": 2.0**-24}, {"loss": 0, "patch": 12})
    telemetry |= {"underflow_rate": {"loss": 0.0, "patch": 1.0}, "needs_float32": ["patch"]}
    from keras_als.telemetry import _mistakes

    stuck = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _mistakes.warn_needs_float32(stuck, telemetry | {"warning": "stuck: ..."})
    assert caught == []  # the stuck warning names the layers itself
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            _mistakes.warn_needs_float32(optimizer, telemetry | {"warning": None})
    assert len(caught) == 1, [str(w.message) for w in caught]
    message = str(caught[0].message)
    assert "float16 loses the gradients of patch (scale 2**-24, 12 overflows" in message
    assert 'layer.dtype_policy = "float32"' in message and "Float32Fallback(x, y)" in message


def test_a_layer_that_overflowed_below_scale_one_is_named_at_the_end_of_fit_after_it_recovered():
    """Targets of 1e7 on the first 5 of 50 batches: the hidden layer's float16
    gradients overflow at every scale down to below 1 (5 skipped steps), then
    the scales rise back to 2**11 on ordinary targets. The layer is still
    `beyond_float16` at the end, and `fit` says so in one warning naming the
    fix; the loss was finite throughout (no step counts as its forward pass)."""
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    model = keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((4,)),
                keras.layers.Dense(8, activation="tanh", name="hidden"),
                keras.layers.Dense(1, dtype="float32", name="out"),
            ]
        )
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer, "mse", jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50 * 8, 4)).astype("float32")
    y = rng.normal(size=(50 * 8, 1)).astype("float32")
    y[: 5 * 8] *= 1e7
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    telemetry = optimizer.telemetry(warn=False)
    assert telemetry["skipped_steps"] == 5 and telemetry["loss_not_finite"] == 0
    assert min(telemetry["scale"].values()) >= 1.0, telemetry["scale"]  # recovered
    assert telemetry["beyond_float16"] == ["hidden"] and telemetry["warning"] is None
    said = [str(w.message) for w in caught if "keras_als" in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0], said
    assert said[0].startswith(
        "keras_als: the gradients of hidden (5 overflows) went beyond float16's range"
    )
    assert "keras_als.Float32Fallback(x, y)" in said[0] and "keras_als.diagnose" in said[0]


def test_the_flags_row_reads_older_checkpoints_which_held_the_measured_flag_alone():
    """The row that says which scales were measured holds the flag of layers
    beyond float16 too, as 2: a checkpoint written before it holds 0 and 1
    and loads into the same layout, with no layer beyond float16."""
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    layer = keras.layers.Dense(1, name="dense")
    model = keras_als.wrap_model(keras.Sequential([keras.Input((2,)), layer]))
    optimizer.build(model.trainable_variables)
    flags = _state.PER_SCALE.index("flags")
    for value, beyond in [(1.0, []), (0.0, []), (2.0, ["dense"]), (3.0, ["dense"])]:
        table = optimizer.scaling.table().numpy()
        table[flags, 1:] = value
        optimizer.scaling.assign(table)
        assert optimizer.telemetry(warn=False)["beyond_float16"] == beyond
        measured = _scale_state.has_flag(table[flags], _scale_state.MEASURED)
        assert float(measured[1]) == value % 2


def test_building_under_mixed_bfloat16_warns_once_that_no_loss_scale_is_needed():
    keras.config.set_dtype_policy("mixed_bfloat16")
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    variables = [keras.Variable(np.zeros(2, "float32"))]
    with pytest.warns(UserWarning, match="mixed_bfloat16, whose range is float32's"):
        optimizer.build(variables)
    keras.config.set_dtype_policy("mixed_float16")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).build(variables)
