"""`_reductions`: each gradient's largest magnitude and subnormal count, as numpy
computes them, read with operations that TensorFlow lowers to XLA quickly.

`amaxes` reads `|g|` as `maximum(g, -g)` and NaN as `g != g`, not with `Abs`
and `IsNan`, which cost the lowering about 5 ms each per weight gradient
(`python -m benchmarks.profiles bridge_ops`). A tensor of zeros may then read
-0.0; the vectors the step packs them into read +0.0.
"""

import math

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from keras_als.step import _crossings, _reductions, _statistics

SPECIAL = st.sampled_from([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-6, -65504.0])


def _expected_amax(array: np.ndarray) -> float:
    """numpy's largest magnitude, inf where a value is NaN."""
    if np.isnan(array).any():
        return math.inf
    return float(np.max(np.abs(array.astype("float64"))))


def _arrays(dtype):
    # TensorFlow's CPU kernels flush float32 subnormals to zero (float16 ones are normal
    # in the float32 they are computed in): those read 0, as they did through `Abs`.
    half = dtype == "float16"
    finite = st.floats(-1e4, 1e4, width=16 if half else 32, allow_subnormal=half)
    values = st.one_of(finite, SPECIAL)
    return hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5), elements=values)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("compiled", [False, True], ids=["graph", "xla"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_each_largest_magnitude_is_numpys_and_nan_reads_as_inf(dtype, compiled, data):
    arrays = [data.draw(_arrays(dtype)) for _ in range(3)]
    reduce = tf.function(lambda *ts: _reductions.amaxes(list(ts)), jit_compile=compiled)
    found = [float(a) for a in reduce(*[tf.constant(a) for a in arrays])]
    assert found == [_expected_amax(a) for a in arrays]  # exact: a max rounds nothing


@pytest.mark.parametrize("compiled", [False, True], ids=["graph", "xla"])
def test_gradients_of_zeros_pack_as_positive_zero(compiled):
    negative = tf.constant([-0.0, -0.0], tf.float16)

    @tf.function(jit_compile=compiled)
    def packed(g):
        weights = _statistics.WeightAmax.of([[g], [g * 0.0]])
        reduced = _crossings.Reduced(_reductions.amaxes([g])[0], tf.constant(0.0))
        crossed = _crossings.Crossed.pack({1: reduced})
        return weights.values, crossed.amax

    for vector in packed(negative):
        assert not np.signbit(vector.numpy()).any()
        assert (vector.numpy() == 0).all()


def test_the_largest_magnitudes_lower_no_abs_or_is_nan_per_gradient():
    gradients = [tf.TensorSpec([3, 4], tf.float16)] * 6

    @tf.function
    def packed(*gradients):
        return _statistics.WeightAmax.of([list(gradients)]).values

    graph = packed.get_concrete_function(*gradients).graph
    types = [op.type for op in graph.get_operations()]
    assert types.count("Abs") == 1  # the packed vector's, for its -0.0
    assert types.count("IsNan") == 0
    assert types.count("Maximum") == len(gradients)


@settings(max_examples=25, deadline=None)
@given(array=_arrays("float16"))
def test_subnormals_are_counted_as_numpy_counts_them(array):
    magnitude = np.abs(array.astype("float64"))
    expected = np.sum((magnitude > 0) & (magnitude < 2.0**-14))
    assert float(_reductions.subnormals(tf.constant(array))) == expected


def test_amaxes_are_each_gradients_largest_magnitude_in_float32_with_nan_reading_as_inf():
    def amax(tensor):
        return _reductions.amaxes([tensor])[0]

    dense = tf.constant([[0.5, -3.0], [2.0, 1.0]])
    half = tf.constant([-1.0, 65504.0], tf.float16)
    rows = tf.IndexedSlices(tf.constant([[-7.0, 1.0]]), tf.constant([0]), tf.constant([4, 2]))
    assert float(amax(dense)) == 3.0
    assert float(amax(rows)) == 7.0  # an Embedding's gradient: its rows
    assert float(amax(half)) == 65504.0  # float16 widened exactly
    assert amax(half).dtype == tf.float32
    assert float(amax(half * 2)) == float("inf")  # float16 overflow
    assert float(amax(tf.constant([1.0, float("nan")]))) == float("inf")
    assert float(amax(tf.zeros((0, 3)))) == 0.0  # nothing: not -inf
    several = _reductions.amaxes([dense, half, rows])
    assert [float(a) for a in several] == [3.0, 65504.0, 7.0]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_widened_float16_gradient_is_reduced_in_float32_to_its_largest_magnitude(
    jit_compile,
):
    """A float32 gradient cast from float16 (a float32 variable used in float16)
    is reduced as the float32 tensor the update reads, not its float16 source
    (which XLA's CPU backend reduces more slowly); the value is the float16
    values' largest magnitude, NaN read as inf, traced and compiled."""
    reduced_in = []

    @tf.function(jit_compile=jit_compile)
    def amax(half, single):
        widened, values = tf.cast(half, tf.float32), half + 0.0
        result = _reductions.amaxes([widened, single, tf.cast(values, tf.float64)])
        graph = tf.compat.v1.get_default_graph()
        reduced_in.extend(op.inputs[0].dtype for op in graph.get_operations() if op.type == "Max")
        return result

    rng = np.random.default_rng(0)
    half = tf.constant(rng.normal(0, 300, (97, 33)), tf.float16)
    single = tf.constant(rng.normal(0, 1, (5,)), tf.float32)
    expected = float(np.max(np.abs(half.numpy().astype(np.float32))))
    widened, alone, double = amax(half, single)
    assert float(widened) == float(double) == expected
    assert float(alone) == float(np.max(np.abs(single.numpy())))
    assert reduced_in == [tf.float32, tf.float32, tf.float64]
    with_nan = tf.tensor_scatter_nd_update(half, [[3, 4]], tf.constant([np.nan], tf.float16))
    assert float(amax(with_nan, single)[0]) == float("inf")
    largest = tf.fill((40, 40), tf.constant(65504.0, tf.float16))
    assert float(amax(largest, single)[0]) == 65504.0
    assert float(_reductions.amaxes([tf.cast(half, tf.float32)])[0]) == expected  # eagerly
