"""`_crossings.Crossings`: the boundaries' gradients, reduced in few branches.

Each crossing gradient is reduced to its largest absolute value, mean square
and zero count, exactly as numpy computes them, on measuring steps only; the
gradients wait and are reduced together, one branch per `WAITING_BYTES`, so
that at most that much of them stays alive.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import keras_als
from keras_als.step import _crossings, _statistics


def _branches(graph) -> int:
    return sum(op.type in ("If", "StatelessIf") for op in graph.get_operations())


def _reduce(arrays, measuring, count_zeros=True):
    """Feeds one gradient per boundary through `Crossings`; returns the reductions
    (as numpy) and the number of branches the traced graph holds."""
    boundaries = [object() for _ in arrays]
    found = {}

    @tf.function
    def step(measuring):
        crossings = _crossings.Crossings(tf.compat.v1.get_default_graph(), measuring, count_zeros)
        for b, a in zip(boundaries, arrays):
            crossings.arrived(b, [tf.constant(a)])
        crossings.finish()
        found["branches"] = _branches(tf.compat.v1.get_default_graph())
        return [
            [r.amax, r.mean_square] + ([r.zeros, r.size] if count_zeros else [])
            for r in (crossings.reduced[id(b)] for b in boundaries)
        ]

    values = [[float(v) for v in row] for row in step(tf.constant(measuring))]
    return values, found["branches"]


def test_a_measuring_step_reduces_each_gradient_as_numpy_does():
    rng = np.random.default_rng(0)
    arrays = [rng.normal(size=(4, 5)).astype("float16"), np.array([0.0, -3.0, 0.0], "float16")]
    values, _ = _reduce(arrays, measuring=True)
    for (largest, square, zeros, size), a in zip(values, arrays):
        a = a.astype("float64")
        assert largest == np.max(np.abs(a))
        assert square == pytest.approx(np.mean(a**2), rel=1e-6)
        assert (zeros, size) == (np.sum(a == 0), a.size)


def test_a_step_that_does_not_measure_reads_zeros():
    values, _ = _reduce([np.ones((4, 4), "float16")], measuring=False)
    assert values == [[0.0, 0.0, 0.0, 0.0]]


def test_a_nan_reads_as_an_infinite_largest_value():
    values, _ = _reduce([np.array([1.0, np.nan], "float16")], measuring=True, count_zeros=False)
    assert values[0][0] == np.inf


@pytest.mark.parametrize(
    ("gradients", "kib_each", "branches"),
    [(10, 8, 2), (8, 8, 1), (3, 128, 3), (1, 1, 1)],
)
def test_waiting_gradients_are_reduced_together_once_they_hold_the_budget(
    gradients, kib_each, branches
):
    # float16: 2 bytes a value. 10 x 8 KiB: one branch at 64 KiB, one for the last 2.
    arrays = [np.ones(kib_each * 512, "float16") for _ in range(gradients)]
    assert _crossings.WAITING_BYTES == 64 * 1024
    _, found = _reduce(arrays, measuring=True)
    assert found == branches


def test_groups_of_gradients_of_one_shape_share_one_traced_branch():
    # Each 128 KiB gradient fills a group alone: four branches, of two shapes.
    boundaries = [object() for _ in range(4)]
    shapes = [(256, 256), (256, 256), (512, 128), (256, 256)]
    found = {}

    @tf.function
    def step(measuring):
        crossings = _crossings.Crossings(tf.compat.v1.get_default_graph(), measuring, False)
        for b, shape in zip(boundaries, shapes):
            crossings.arrived(b, [tf.ones(shape, tf.float16)])
        crossings.finish()
        graph = tf.compat.v1.get_default_graph()
        branches = [op for op in graph.get_operations() if op.type == "StatelessIf"]
        found["ifs"] = len(branches)
        found["traced"] = len({op.get_attr("then_branch").name for op in branches})
        return [crossings.reduced[id(b)].amax for b in boundaries]

    assert [float(v) for v in step(tf.constant(True))] == [1.0] * 4
    assert found == {"ifs": 4, "traced": 2}


def test_gradients_from_a_nested_graph_are_not_part_of_the_plan():
    boundary = object()

    @tf.function
    def step():
        crossings = _crossings.Crossings(tf.compat.v1.get_default_graph(), None, False)

        @tf.function
        def nested():
            crossings.arrived(boundary, [tf.ones(3)])
            return tf.constant(0.0)

        nested()
        crossings.finish()
        return len(crossings.reduced)

    assert int(step()) == 0


def test_under_xla_the_reductions_stay_in_a_branch_that_steps_not_measuring_skip():
    # XLA turns a branch of elementwise operations and reductions alone into a
    # select of both branches, which runs the reductions on every step.
    boundary = object()

    @tf.function(jit_compile=True)
    def step(gradient, measuring):
        crossings = _crossings.Crossings(tf.compat.v1.get_default_graph(), measuring, False)
        crossings.arrived(boundary, [tf.tanh(gradient) * 2.0])
        crossings.finish()
        return crossings.reduced[id(boundary)].amax

    gradient = tf.constant(np.linspace(-2, 2, 64, dtype="float32").reshape(8, 8))
    hlo = step.experimental_get_compiler_ir(gradient, tf.constant(True))(stage="optimized_hlo")
    assert hlo.count(" conditional(") == 1
    assert float(step(gradient, tf.constant(False))) == 0.0
    assert float(step(gradient, tf.constant(True))) == pytest.approx(2 * np.tanh(2.0), rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.5, 3.0, 1e4, np.inf]), st.booleans()),
        max_size=12,
    )
)
def test_per_component_reductions_of_the_statistics_match_a_loop_over_components(rows):
    """`measure` reduces every component's values at once, by a membership
    mask: the largest value (0 for none), whether any flag holds, and the mean
    are those of a loop over the components."""
    n = 4
    segments = [s for s, _, _ in rows]
    values = np.array([v for _, v, _ in rows], np.float32)
    flags = np.array([f for _, _, f in rows], bool)
    largest = _statistics._segment_max(tf.constant(values), segments, n).numpy()
    any_flag = _statistics._segment_any(tf.constant(flags), segments, n).numpy()
    for i in range(n):
        mine = [k for k, s in enumerate(segments) if s == i]
        assert largest[i] == (max(values[mine]) if mine else 0.0)
        assert any_flag[i] == any(flags[mine])
    if rows and np.all(np.isfinite(values)):
        mean = _statistics._segment_mean(tf.constant(values), segments, n).numpy()
        for i in range(n):
            mine = [k for k, s in enumerate(segments) if s == i]
            expected = np.mean(values[mine]) if mine else 0.0
            assert mean[i] == pytest.approx(expected, rel=1e-6)


def _branch_inputs(layers: int) -> list[int]:
    """Inputs of each conditional of a traced step of `layers` wrapped Dense
    layers, but the crossings' own and the one that applies the gradients
    (the one with the most: every gradient and variable)."""
    keras.utils.set_random_seed(0)
    stack = [keras.Input((4,))] + [keras.layers.Dense(4) for _ in range(layers)]
    model = keras_als.wrap_model(keras.Sequential(stack))
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(), measure_every_n_steps=4
    )
    optimizer.build(model.trainable_variables)

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = optimizer.scale_loss(tf.reduce_sum(model(x) ** 2))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    graph = step.get_concrete_function(tf.TensorSpec([2, 4])).graph
    inputs = sorted(
        len(op.inputs)
        for op in graph.get_operations()
        if op.type in ("If", "StatelessIf") and "reduce" not in op.get_attr("then_branch").name
    )
    return inputs[:-1]


def test_the_measuring_branch_takes_as_many_inputs_whatever_the_number_of_boundaries():
    # Each input of a branch is traced and lowered to XLA on its own: the
    # crossing statistics enter packed in two vectors (`Crossed`), not two per boundary.
    few, many = _branch_inputs(2), _branch_inputs(8)
    assert few and few == many
