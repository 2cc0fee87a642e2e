"""`measure_every_n_steps`: when the boundaries measure and the scales change.

The scales may change only on a measuring step: on the step after a skipped
one, on the step after a measurement that grew a scale blind (its gradients
were all zero), and else after a period that doubles from 1 up to n while the
scales hold and shrinks in proportion to how fast the gradients grow
(`_apply_phases.next_period`). Steps in between keep every scale.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als import policies
from keras_als.step import _apply_phases


def _since_measured(optimizer) -> int:
    return int(optimizer.scaling.counter("steps_since_measured").numpy())


def _until_measuring(optimizer) -> int:
    return int(optimizer.scaling.counter("steps_until_measuring").numpy())


@pytest.fixture(autouse=True)
def mixed():
    keras.config.set_dtype_policy("mixed_float16")
    yield
    keras.config.set_dtype_policy("float32")


def _setup(measure_every_n_steps, activation="tanh", depth=2, initial_scale=2.0**15):
    """A wrapped MLP at learning rate 0, its optimizer, and a step whose loss is
    multiplied by `factor` (so its gradients grow exactly by `factor`)."""
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(16, activation=activation) for _ in range(depth)]
    model = keras_als.wrap_model(
        keras.Sequential([keras.Input((8,)), *layers, keras.layers.Dense(1, dtype="float32")])
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.0),
        measure_every_n_steps=measure_every_n_steps,
        initial_scale=initial_scale,
    )
    factor = tf.Variable(1.0)
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(32, 8)).astype("float32"))
    y = tf.constant(rng.normal(size=(32, 1)).astype("float32"))

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            loss = factor * tf.reduce_mean(tf.square(model(x, training=True) - y))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    return optimizer, factor, step


def test_scales_change_only_on_every_nth_step_once_settled():
    n = 4
    optimizer, factor, step = _setup(n)
    for _ in range(3 * n):  # settle at learning rate 0
        step()
    settled = optimizer.layer_scales()
    until = _until_measuring(optimizer)
    factor.assign(2.0**5)  # gradients 32x larger: every max-safe scale falls by ~32x
    unchanged_steps = 0
    while optimizer.layer_scales() == settled:
        step()
        unchanged_steps += 1
        assert unchanged_steps <= n
    # The step that changed the scales was the first with nothing left until measuring.
    assert unchanged_steps == until + 1
    new = optimizer.layer_scales()
    assert all(new[k] < settled[k] for k in settled), (settled, new)
    assert int(optimizer.skipped_steps.numpy()) == 0


def _measuring_steps(optimizer, step, steps, growth=1.0, factor=None):
    """Which of the next `steps` steps measured (the counter since restarts at 0),
    multiplying the loss by `growth` before each."""
    measured = []
    for i in range(steps):
        if factor is not None:
            factor.assign(factor * growth)
        step()
        if _since_measured(optimizer) == 0:
            measured.append(i)
    return measured


def test_settled_scales_are_measured_after_periods_doubling_up_to_n():
    optimizer, _, step = _setup(16)
    measured = _measuring_steps(optimizer, step, 60)
    gaps = np.diff(measured).tolist()
    # The first steps settle (gap 1); then the period doubles and stays at 16.
    settled = gaps.index(2)
    assert gaps[settled:] == [2, 4, 8, 16, 16][: len(gaps) - settled], measured
    assert all(g == 1 for g in gaps[:settled]), measured
    assert int(optimizer.skipped_steps.numpy()) == 0


@pytest.mark.parametrize("binades_per_step", [1, 2])
def test_gradients_that_keep_growing_overflow_once_then_are_measured_often_enough(binades_per_step):
    # Once the period is 16, the gradients start to grow by 2**binades_per_step
    # every step (as VGG16's did under Adam). They pass the margin of 6 binades
    # before the next measurement: that step is skipped. After it, the period
    # restarts at 1 and stays short while they grow: no other step is skipped
    # (a period back at 16 after every measurement would skip one every ~7 steps).
    optimizer, factor, step = _setup(16)
    for _ in range(60):  # until a measurement has just set the period to 16
        step()
        if _until_measuring(optimizer) == 15:
            break
    assert _until_measuring(optimizer) == 15
    steps = 36 // binades_per_step  # 2**36 in all
    measured = _measuring_steps(optimizer, step, steps, 2.0**binades_per_step, factor)
    # From the first measurement on (the skipped step's), the gradients grow
    # by less than MaxSafe's margin between two measurements ...
    growth = binades_per_step * np.diff(measured)
    assert len(measured) >= 2 and max(growth) < policies.MaxSafe().margin, measured
    assert int(optimizer.skipped_steps.numpy()) == 1, optimizer.telemetry()["overflows"]
    # ... without measuring on every step where one binade per step allows
    # fewer (two binades allow a period of 1 step: half the margin is planned).
    if binades_per_step == 1:
        assert len(measured) <= 0.7 * steps, measured


def test_gradients_that_only_swing_with_the_batch_are_not_measured_on_most_steps():
    # Each batch's gradients are 1x or 16x (at random) those of the last: a
    # measurement sees its scales fall or rise 16-fold about half the time,
    # as ConvNeXtTiny's last stages at 32x32 do. 16x stays within the margin
    # of 6 binades, so nothing overflows, and the period need not drop to 1
    # step at each swing (measuring on every other step or so: 629 of 1,050
    # steps on ConvNeXtTiny before the period followed the rate of growth).
    optimizer, factor, step = _setup(16)
    swings = np.random.default_rng(1).integers(0, 2, 200)
    measured = []
    for i, swing in enumerate(swings):
        factor.assign(16.0 ** float(swing))
        step()
        if _since_measured(optimizer) == 0:
            measured.append(i)
    assert int(optimizer.skipped_steps.numpy()) == 0
    assert len(measured) <= 40, measured  # 200 / 16 = 12.5 at the longest period


@pytest.mark.parametrize(
    ("fell", "elapsed", "period"),
    [
        (1.0, 1, 2),  # held: twice the last period
        (2.0, 4, 8),  # fell 1 binade: twice (3 binades at that rate would take 12)
        (4.0, 4, 6),  # fell 2 binades in 4 steps: 3 binades take 6
        (8.0, 4, 4),  # fell 3: the same period
        (16.0, 8, 6),  # fell 4 in 8 steps: 3 binades take 6
        (2.0**6, 16, 8),  # fell 6: half
        (8.0, 1, 1),  # ... at least 1
        (1 / 16, 8, 16),  # rose: twice
        (1 / policies.BLIND_GROWTH, 8, 1),  # grew blind (gradients all zero): the next step
        (1.0, 12, 16),  # never more than n
    ],
)
def test_the_next_period_follows_how_far_the_scales_fell_in_the_last(fell, elapsed, period):
    old = tf.constant([2.0**10, 2.0**3])
    new = tf.constant([2.0**10 / fell, 2.0**3])
    result = _apply_phases.next_period(old, new, tf.constant(elapsed), 16)
    assert int(result.numpy()) == period


def test_measuring_every_step_changes_the_scales_on_the_next_step():
    optimizer, factor, step = _setup(1)
    for _ in range(4):
        step()
    settled = optimizer.layer_scales()
    factor.assign(2.0**5)
    step()
    assert all(optimizer.layer_scales()[k] < settled[k] for k in settled)


def _skipped_until_recovered(optimizer, step):
    """Steps skipped until the first finite step (at most 16)."""
    for _ in range(16):
        before = int(optimizer.skipped_steps.numpy())
        step()
        if int(optimizer.skipped_steps.numpy()) == before:
            return int(optimizer.skipped_steps.numpy())
    pytest.fail(f"still skipping after 16 steps; scales {optimizer.layer_scales()}")


def test_an_overflow_between_measurements_backs_off_at_once_and_costs_no_extra_skipped_step():
    skipped = {}
    for n in (1, 16):
        optimizer, factor, step = _setup(n)
        for _ in range(n + 3):
            step()
        settled = optimizer.layer_scales()
        if n > 1:
            assert _since_measured(optimizer) != 0  # next step: no measuring
        factor.assign(2.0**14)  # far beyond the margin: the scaled gradients overflow
        if n > 1:
            step()
            assert int(optimizer.skipped_steps.numpy()) == 1
            # Nothing was measured, but the float16 layers the overflow reached
            # (non-finite weight gradients) backed off by BACKOFF at once.
            now = optimizer.layer_scales()
            for name in list(now)[1:3]:  # the two float16 layers, after the loss
                assert now[name] == settled[name] * policies.BACKOFF
            assert now["loss"] == settled["loss"]  # float32 head: not reached
            assert _since_measured(optimizer) == 0  # so the next step measures
        skipped[n] = _skipped_until_recovered(optimizer, step)
        assert optimizer.layer_scales()["loss"] < settled["loss"]
    assert skipped[16] == skipped[1], skipped


def test_settling_scales_are_measured_on_every_step_until_they_settle():
    # Gradients of ~2**-30 at scale 1 underflow to zero in float16 below the
    # float32 head: the first measurement fixes the loss's scale only, and the
    # layers' scales can be chosen only when the next step measures them.
    scales = {}
    for n in (1, 16):
        optimizer, factor, step = _setup(n, initial_scale=1.0)
        factor.assign(2.0**-30)
        for _ in range(4):
            step()
        scales[n] = list(optimizer.layer_scales().values())  # loss, then layers in order
    assert scales[16] == scales[1]
    assert min(scales[1]) >= 2.0**25, scales[1]


def test_the_period_survives_get_config():
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(), measure_every_n_steps=7
    )
    restored = keras_als.AdaptiveLossScaleOptimizer.from_config(optimizer.get_config())
    assert restored.measure_every_n_steps == 7


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "16"])
def test_an_invalid_period_names_the_argument(value):
    with pytest.raises(ValueError, match="measure_every_n_steps"):
        keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(), measure_every_n_steps=value)


def test_an_overflow_right_after_a_measurement_raised_the_scales_far_returns_them_at_once():
    # Gradients of ~2**-20 at scale 1: the first measurement raises the layers'
    # scales by about 2**20. The next step's gradients are 2**20 times larger
    # (as when Adam's first update moves a parameter initialised at 1e-6 by
    # its learning rate): it overflows. Backing off by BACKOFF alone would
    # take about five skipped steps; returning to the scales of the measuring
    # step, which was finite, takes one.
    optimizer, factor, step = _setup(1, initial_scale=1.0)
    factor.assign(2.0**-20)
    step()  # weights as initialised: the measurement only lowers scales
    step()  # measured at scale 1 everywhere, and finite
    raised = optimizer.layer_scales()
    float16_layers = list(raised)[1:3]  # after the float32 head's ("loss")
    assert all(raised[name] >= 2.0**16 for name in float16_layers), raised
    factor.assign(1.0)
    step()
    assert int(optimizer.skipped_steps.numpy()) == 1
    after = optimizer.layer_scales()
    assert [after[name] for name in float16_layers] == [1.0, 1.0], (raised, after)
    assert _skipped_until_recovered(optimizer, step) == 1


class _LayerScale(keras.layers.Layer):
    """ConvNeXt's layer scale: the input times a vector initialised at 1e-6."""

    def build(self, input_shape):
        self.gamma = self.add_weight(
            shape=(input_shape[-1],), initializer=keras.initializers.Constant(1e-6)
        )

    def call(self, inputs):
        return inputs * keras.ops.cast(self.gamma, inputs.dtype)


def test_the_step_after_the_first_measures_again_to_raise_what_the_first_held():
    # At scale 1 the first step's gradients ask for scales about 2**13 higher
    # (less than a blind growth); before the first update none may rise, so
    # the next step measures, one update later, and raises them.
    optimizer, _, step = _setup(16, initial_scale=1.0)
    step()
    assert max(optimizer.layer_scales().values()) <= 1.0
    assert _until_measuring(optimizer) == 0
    step()
    assert min(optimizer.layer_scales().values()) >= 2.0**8, optimizer.layer_scales()


def test_no_scale_rises_before_the_first_update_so_weights_initialised_near_zero_do_not_overflow():
    # The dense layer's gradients pass through a layer scale of 1e-6 (ConvNeXt's
    # init): at the initial weights they are ~2**-20 of their size one Adam
    # update later, when the scale has moved by its learning rate, a thousandfold.
    # A scale raised from the first step's gradients overflows on the second.
    keras.utils.set_random_seed(0)
    model = keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(32, activation="tanh", name="dense"),
                _LayerScale(name="layer_scale"),
                keras.layers.Dense(1, dtype="float32", name="head"),
            ]
        )
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype("float32")
    y = rng.normal(size=(16, 1)).astype("float32")
    model.train_on_batch(x, y)
    first = optimizer.layer_scales()
    assert max(first.values()) <= 2.0**15, first  # measured, and held at the initial scale
    for _ in range(10):
        model.train_on_batch(x, y)
    assert int(optimizer.skipped_steps.numpy()) == 0, optimizer.telemetry()["overflows"]
    # The rise came one step later: the dense layer's scale is far above the initial one.
    assert optimizer.layer_scales()["dense"] >= 2.0**18, optimizer.layer_scales()
