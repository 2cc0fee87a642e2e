"""The boundary's backward rescaling: exact for any power of two, at any rank,
with every factor from the plan's one vector division."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from benchmarks.harness import ablations
from keras_als.step import _boundary, _state, _step_record

SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan]


def _gradient(shape, dtype) -> np.ndarray:
    """Normal values spread over 2**-20 to 2**11, the special values first."""
    rng = np.random.default_rng(0)
    values = rng.standard_normal(shape) * 2.0 ** rng.integers(-20, 12, shape)
    values.reshape(-1)[: len(SPECIAL)] = SPECIAL
    return values.astype(dtype)


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("exponent", [-88, 10, 88])
@pytest.mark.parametrize("divides", [True, False])
@pytest.mark.parametrize("shape", [(16,), (2, 3, 16), (2, 3, 3, 16)])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_rescaling_by_a_power_of_two_rounds_once_from_the_exact_quotient(
    dtype, shape, divides, exponent, jit_compile
):
    values = _gradient(shape, dtype)
    # float64 holds every quotient exactly; casting rounds it once, as float32 must.
    with np.errstate(over="ignore"):  # quotients beyond the dtype's range: inf
        expected = (values.astype(np.float64) / 2.0**exponent).astype(dtype)
    factor = 2.0**exponent if divides else 2.0**-exponent
    rescale = tf.function(_boundary.rescale, jit_compile=jit_compile)
    got = rescale(tf.constant(values), tf.constant(factor, tf.float32), divides).numpy()
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def _traced_boundary(make, spec: tf.TensorSpec, variant: str):
    """The boundary placed on `make(x)` in a traced backward pass under
    ablation `variant`, and the operation types of that graph."""
    boundaries = []

    @tf.function
    def backward(x, factor):
        with tf.GradientTape() as tape:
            tape.watch(x)
            (y,) = _boundary.insert(keras.layers.Layer(), [make(x)])
        boundary = _step_record.read().boundaries[-1]
        boundary.connect(factor, None)
        boundaries.append(boundary)
        return tape.gradient(y, x)

    with ablations.named(variant):
        graph = backward.get_concrete_function(spec, tf.TensorSpec([], tf.float32)).graph
    return boundaries[0], [op.type for op in graph.get_operations()]


@pytest.mark.parametrize("variant", ["", "feature_maps_divided", "feature_maps_multiplied"])
@pytest.mark.parametrize("concatenated", [False, True])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_boundaries_divide_up_to_the_divided_rank_and_on_concatenations(
    rank, concatenated, variant
):
    """Up to `DIVIDED_RANK`, or on a tensor a concatenation made, a boundary
    divides; on other larger tensors it multiplies. The benchmarks' variants
    make every boundary divide (`feature_maps_divided`) or every feature map's
    multiply (`feature_maps_multiplied`)."""

    def make(x):
        return tf.concat([x, x], axis=-1) if concatenated else x

    boundary, kinds = _traced_boundary(make, tf.TensorSpec([2] * rank, tf.float16), variant)
    divided_concatenation = concatenated and variant != "feature_maps_multiplied"
    expected = rank <= _boundary.DIVIDED_RANK or divided_concatenation
    assert boundary.divides == (expected or variant == "feature_maps_divided")
    if boundary.divides:
        assert kinds.count("RealDiv") == 1 and "Mul" not in kinds, kinds
    else:
        assert kinds.count("Mul") == 1 and "RealDiv" not in kinds, kinds


MAKERS = {
    "conv2d": lambda x: tf.nn.conv2d(x, tf.ones((1, 1, 2, 2), x.dtype), 1, "VALID"),
    "depthwise": lambda x: tf.nn.depthwise_conv2d(
        x, tf.ones((1, 1, 2, 1), x.dtype), [1] * 4, "VALID"
    ),
    "relu": tf.nn.relu,
}


@pytest.mark.parametrize("variant", ["", "feature_maps_multiplied"])
@pytest.mark.parametrize("made_by", list(MAKERS))
def test_a_boundary_on_a_convolutions_feature_maps_divides_and_on_an_activations_multiplies(
    made_by, variant
):
    """Feature maps a convolution made (read back by two convolutions) divide;
    an activation's (read by one fusion) multiply, as every feature map does
    under `feature_maps_multiplied`."""
    spec = tf.TensorSpec([2, 3, 3, 2], tf.float32)
    boundary, kinds = _traced_boundary(MAKERS[made_by], spec, variant)
    divides = made_by != "relu" and variant != "feature_maps_multiplied"
    assert boundary.divides == divides
    assert kinds.count("RealDiv" if divides else "Mul") == 1, kinds


def test_every_boundarys_factor_is_exact_and_reads_its_scales_through_runtime_indices():
    """Two convolutions (feature maps: the boundary multiplies) and two dense
    layers (features: it divides), each with its own scale: every factor is
    the divisor or its reciprocal, exactly, a division of two scales each read
    at an index held in a variable (`_indices`), not at a constant offset."""
    model = keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((8, 8, 3)),
                keras.layers.Conv2D(4, 3, name="conv_a"),
                keras.layers.Conv2D(4, 3, name="conv_b"),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(5, name="dense_a"),
                keras.layers.Dense(1, name="dense_b"),
            ]
        )
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    optimizer.build(model.trainable_variables)
    table = optimizer.scaling.table().numpy()
    table[_state.PER_SCALE.index("scale")] = [2.0 ** (3 + 5 * i) for i in range(table.shape[1])]
    optimizer.scaling.assign(table)
    seen = []

    @tf.function
    def factors():
        optimizer.scale_loss(tf.reduce_sum(model(tf.ones((1, 8, 8, 3)))))
        plan = _step_record.read().plan_for(optimizer)
        crossing = [b for b in plan.boundaries() if id(b) in plan.factors]
        seen.extend((b.divides, *plan.sides[id(b)], plan.factors[id(b)].op) for b in crossing)
        return tf.stack([plan.factors[id(b)] for b in crossing]), plan.scales

    got, scales = (t.numpy() for t in factors())
    assert sorted(divides for divides, _, _, _ in seen) == [False, True, True]
    for *_, op in seen:
        assert op.type == "RealDiv", op.type
        reads = [t.op for t in op.inputs]
        assert [r.type for r in reads] == ["GatherV2", "GatherV2"], reads
        assert all(r.inputs[1].op.type == "ReadVariableOp" for r in reads)
    for (divides, upstream, own, _), factor in zip(seen, got):
        divisor = scales[own] / scales[upstream]
        assert divisor != 1.0
        assert factor == (divisor if divides else 1.0 / divisor)
