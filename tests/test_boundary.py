"""The boundary's backward rescaling: exact for any power of two, at any rank."""

import numpy as np
import pytest
import tensorflow as tf

from keras_als import _boundary

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan]


def _gradient(shape, dtype) -> np.ndarray:
    """Normal values spread over 2**-20 to 2**11, the special values first."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 12, shape)
    values.reshape(-1)[: len(SPECIAL)] = SPECIAL
    return values.astype(dtype)


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("exponent", [-88, 10, 88])
@pytest.mark.parametrize("shape", [(16,), (2, 3, 16), (2, 3, 3, 16)])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_dividing_by_a_power_of_two_rounds_once_from_the_exact_quotient(
    dtype, shape, exponent, jit_compile
):
    values = _gradient(shape, dtype)
    # float64 holds every quotient exactly; casting rounds it once, as float32 must.
    expected = (values.astype(np.float64) / 2.0**exponent).astype(dtype)
    divide = tf.function(_boundary.divide, jit_compile=jit_compile)
    got = divide(tf.constant(values), tf.constant(2.0**exponent, tf.float32)).numpy()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_gradients_up_to_the_divided_rank_are_divided_and_larger_ones_multiplied(rank):
    @tf.function
    def rescale(gradient, divisor):
        return _boundary.divide(gradient, divisor)

    graph = rescale.get_concrete_function(
        tf.TensorSpec([2] * rank, tf.float16), tf.TensorSpec([], tf.float32)
    ).graph
    kinds = {op.type for op in graph.get_operations()}
    if rank <= _boundary.DIVIDED_RANK:
        assert "RealDiv" in kinds and "Mul" not in kinds, kinds
    else:
        assert "Mul" in kinds, kinds
