"""AdaptiveLossScaleOptimizer: configuration, errors, saving, the backend check."""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als import policies
from tests import models

KERAS_VERSION = tuple(int(part) for part in keras.version().split(".")[:2])


def test_config_round_trip_keeps_the_policy_and_the_inner_optimizer():
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.Adam(3e-4),
        policy=policies.ApproxRange(max_ratio=None),
        initial_scale=2.0**8,
    )
    config = optimizer.get_config()
    restored = keras_als.AdaptiveLossScaleOptimizer.from_config(config)
    assert restored.get_config() == config
    assert restored.policy == policies.ApproxRange(max_ratio=None)
    assert restored.initial_scale == 2.0**8
    assert isinstance(restored.inner_optimizer, keras.optimizers.Adam)
    serialized = keras.saving.serialize_keras_object(optimizer)
    again = keras.saving.deserialize_keras_object(serialized)
    assert type(again) is keras_als.AdaptiveLossScaleOptimizer


def test_fixed_policy_survives_serialization():
    policy = policies.Fixed(default=4.0, scales={"dense": 2.0**10})
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(), policy=policy)
    restored = keras_als.AdaptiveLossScaleOptimizer.from_config(optimizer.get_config())
    assert restored.policy == policy


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: keras_als.AdaptiveLossScaleOptimizer(3), TypeError, "keras.optimizers"),
        (
            lambda: keras_als.AdaptiveLossScaleOptimizer(
                keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
            ),
            ValueError,
            "inner_optimizer",
        ),
        (
            lambda: keras_als.AdaptiveLossScaleOptimizer(
                keras.optimizers.SGD(), initial_scale=-1000
            ),
            ValueError,
            "finite number between",
        ),
        (
            lambda: keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(), policy="dynamic"),
            ValueError,
            "max_safe",
        ),
        (
            lambda: keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(), clipnorm=1.0),
            ValueError,
            r"inner_optimizer.*Adam\(clipnorm=",
        ),
    ],
)
def test_invalid_arguments_name_the_fix(make, error, match):
    with pytest.raises(error, match=match):
        make()


def test_layer_scales_before_and_after_build():
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(), initial_scale=2.0**4)
    assert optimizer.layer_scales() == {"loss": 16.0}
    model = keras_als.wrap_model(models.sequential_mlp()[0])
    optimizer.build(model.trainable_variables)
    assert optimizer.layer_scales() == {
        "loss": 16.0,
        "dense": 16.0,
        "dense_1": 16.0,
        "dense_2": 16.0,
        "dense_3": 16.0,
    }


def test_the_optimizer_keeps_its_state_in_one_variable_beyond_keras_s():
    """Every variable a compiled step updates costs it a fixed time on a CPU
    (`python -m benchmarks.real_models --parts breakdown`, `keras_with_state`):
    keras_als's optimizer adds one to Keras's, whatever the number of scales."""
    model = keras_als.wrap_model(models.sequential_mlp()[0])
    ours = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam())
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    ours.build(model.trainable_variables)
    theirs.build(model.trainable_variables)
    names = {v.path.split("/")[-1] for v in ours.variables} - {
        v.path.split("/")[-1] for v in theirs.variables
    }
    assert len(ours.variables) == len(theirs.variables) + 1
    assert names == {"scale_state"}


def test_a_keras_file_holds_the_plain_model_and_wrapping_it_again_resumes_the_scales(tmp_path):
    model, x, y = models.residual_cnn()
    model = keras_als.wrap_model(model)
    model.compile(
        optimizer=keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam()), loss="mse"
    )
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    assert type(loaded.optimizer) is keras_als.AdaptiveLossScaleOptimizer
    assert "keras_als" not in json.dumps(loaded.get_config())  # the user's model, as it was
    assert set(loaded.optimizer.layer_scales()) == {"loss"}  # no boundaries yet

    keras_als.wrap_model(loaded)
    assert loaded.optimizer.layer_scales() == model.optimizer.layer_scales()
    assert len(set(model.optimizer.layer_scales().values())) > 1
    model.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    loaded.fit(x, y, batch_size=16, epochs=1, verbose=0, shuffle=False)
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert loaded.optimizer.layer_scales() == model.optimizer.layer_scales()


def test_import_fails_clearly_on_another_backend():
    # Other backends need packages not installed here (jax, torch), so the
    # backend Keras reports is replaced before keras_als checks it.
    code = "import keras; keras.config.backend = lambda: 'jax'; import keras_als"
    result = subprocess.run(
        [sys.executable, "-c", code], env=dict(os.environ), capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "KERAS_BACKEND=tensorflow" in result.stderr


def test_apply_traced_apart_from_scale_loss_is_refused():
    import tensorflow as tf

    model = keras_als.wrap_model(models.sequential_mlp()[0])
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build(model.trainable_variables)
    x = np.ones((4, 12), "float32")

    @tf.function
    def gradients():
        with tf.GradientTape() as tape:
            scaled = optimizer.scale_loss(tf.reduce_mean(model(x)))
        return tape.gradient(scaled, model.trainable_variables)

    @tf.function
    def apply(grads):
        optimizer.apply(grads, model.trainable_variables)

    with pytest.raises(ValueError, match="one traced function"):
        apply(gradients())


def test_a_tensor_captured_by_the_step_function_is_fine():
    import tensorflow as tf

    model = keras_als.wrap_model(models.sequential_mlp()[0])
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    x = tf.constant(np.random.default_rng(0).normal(size=(16, 12)), tf.float32)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            scaled = optimizer.scale_loss(tf.reduce_mean(tf.square(model(x))))
        optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)

    step()
    step()
    assert int(optimizer.iterations.numpy()) == 2


def test_the_step_record_keeps_no_dropped_optimizer_or_layer_alive():
    """TensorFlow may keep a traced graph after its function is gone; the step
    record lives on that graph, so it must hold the optimizer and the wrapped
    layers weakly."""
    import gc
    import weakref

    import tensorflow as tf

    from keras_als.step import _step_record

    def train_one_step():
        model = keras_als.wrap_model(models.sequential_mlp()[0])
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
        x = tf.constant(np.ones((4, 12)), tf.float32)

        @tf.function
        def step():
            with tf.GradientTape() as tape:
                scaled = optimizer.scale_loss(tf.reduce_mean(tf.square(model(x))))
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        step()
        record = _step_record.read(step.get_concrete_function().graph)
        assert record.plan_for(optimizer) is not None and len(record.boundaries) == 4
        wrappers = [weakref.ref(b.owner) for b in record.boundaries]
        return weakref.ref(optimizer), wrappers

    optimizer, wrappers = train_one_step()  # model, optimizer and step are dropped on return
    gc.collect()
    assert optimizer() is None
    assert all(w() is None for w in wrappers)


def test_finiteness_is_checked_per_component_and_a_component_without_values_is_finite():
    from keras_als.step import _apply_phases, _statistics

    inf, nan = float("inf"), float("nan")
    grads = [[tf.constant([1.0]), tf.constant([inf])], [], [tf.constant([65504.0])], []]
    amax = _statistics.WeightAmax.of(grads).extended([(3, tf.constant(nan))])
    assert amax.components == (0, 0, 2, 3)
    not_finite = _apply_phases._not_finite_per_component(amax, 4)
    assert not_finite.numpy().tolist() == [True, False, False, True]
    nothing = _statistics.WeightAmax.of([[], []])
    assert _apply_phases._not_finite_per_component(nothing, 2).numpy().tolist() == [False, False]


def _conditionals_holding(hlo: str, op_name_part: str) -> int:
    """Conditionals in optimized HLO text whose branches (and the computations
    these call, fusions included) hold an operation named with `op_name_part`."""
    computations, name = {}, None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            name = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
            computations[name] = []
        elif name is not None:
            computations[name].append(line)
    called = re.compile(r"(?:calls|to_apply|_computation|branch_computations)=\{?([%\w.,\s-]+)")

    def holds(computation, seen) -> bool:
        if computation in seen or computation not in computations:
            return False
        seen.add(computation)
        for line in computations[computation]:
            match = re.search(r'op_name="([^"]*)"', line)
            if match and op_name_part in match.group(1).lower():
                return True
            for group in called.findall(line):
                if any(holds(c.strip().lstrip("%"), seen) for c in group.split(",")):
                    return True
        return False

    count = 0
    for lines in computations.values():
        for line in lines:
            if " conditional(" in line:
                branches = re.findall(r"(?:true|false)_computation=%?([\w.-]+)", line) + [
                    c.strip().lstrip("%")
                    for group in re.findall(r"branch_computations=\{([^}]*)\}", line)
                    for c in group.split(",")
                ]
                count += any(holds(b, set()) for b in branches)
    return count


@pytest.mark.parametrize(("in_branch", "held"), [("matmul", 1), ("elementwise", 0)])
def test_conditionals_holding_counts_a_conditional_whose_branch_holds_the_update(in_branch, held):
    # The positive control of the test below: a Keras Adam update in a `tf.cond`
    # of a compiled function. With a matrix product in the branch XLA keeps it a
    # conditional, which must be counted; with elementwise work only, XLA makes
    # it selects, and the update is in the HLO but in no conditional.
    optimizer = keras.optimizers.Adam(1e-3)
    kernel = keras.Variable(tf.ones((4, 4)))
    optimizer.build([kernel])

    @tf.function(jit_compile=True)
    def step(apply, x):
        def update():
            gradient = tf.matmul(x, x, transpose_a=True) if in_branch == "matmul" else 2.0 * x
            optimizer.apply([gradient], [kernel])
            return tf.constant(1)

        return tf.cond(apply, update, lambda: tf.constant(0))

    args = (tf.constant(True), tf.ones((4, 4)))
    step(*args)
    hlo = step.experimental_get_compiler_ir(*args)(stage="optimized_hlo")
    assert "adam" in hlo.lower()
    assert _conditionals_holding(hlo, "adam") == held


@pytest.mark.parametrize("optimizer_class", ["keras", "keras_als"])
def test_under_xla_the_weight_update_is_not_a_conditional_but_selects_as_for_keras(
    optimizer_class,
):
    # XLA turns an apply-or-skip conditional whose branches are elementwise into
    # selects, which run faster on a CPU; a scatter, gather or matrix product in
    # a branch (learning from an overflow has them) keeps it a conditional.
    keras.utils.set_random_seed(0)
    model, x, y = models.residual_cnn()
    if optimizer_class == "keras_als":
        model = keras_als.wrap_model(model)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    else:
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    loss_fn = keras.losses.MeanSquaredError()

    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(loss_fn(y, model(x, training=True)))
        variables = model.trainable_variables
        optimizer.apply(tape.gradient(loss, variables), variables)

    x, y = tf.constant(x[:4]), tf.constant(y[:4])
    step(x, y)  # builds the optimizer's variables
    hlo = step.experimental_get_compiler_ir(x, y)(stage="optimized_hlo")
    assert "adam" in hlo.lower()  # the update is in the compiled step ...
    assert _conditionals_holding(hlo, "adam") == 0  # ... and in no conditional
