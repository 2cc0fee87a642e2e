"""Real architectures: keras.applications and KerasHub models, instrumented in place.

The models come from `benchmarks.real_models`: MobileNetV2 and ResNet50V2
(`weights=None`, 32x32 inputs) and tiny KerasHub GPT-2 and BERT backbones built
from their constructors (no download). `wrap_model` instruments each in place,
so every comparison with "the plain model" is with a separate model built the
same way with the same weights. What each test checks, and to what tolerance,
is in its docstring; the README's exactness claims are these.
"""

import json
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from benchmarks.profiles import wrap_sweep
from benchmarks.real_models import architectures, programs, skips
from keras_als import policies
from keras_als.step import _state, _step_record
from tests import in_place, models

pytest.importorskip("keras_hub")

ALL = sorted(architectures.MODELS)
# ResNet50V2's 23M weights make each XLA compile long: it runs in the slow set.
FAST = [name for name in ALL if name != "resnet50_v2"]
CNNS = ("mobilenet_v2", "resnet50_v2")


@pytest.mark.parametrize("name", ALL)
def test_wrap_model_keeps_every_weight_class_and_config_and_computes_the_same_outputs(
    name, tmp_path
):
    """In place: every weight object, its path and order, the class and config
    kept; traced outputs equal a plain model's with the same weights within
    float32 rounding; every layer with weights of its own gets a scale; the
    `.keras` file of the instrumented model is the plain model's (it loads
    without keras_als, to the plain model's outputs bit for bit)."""
    model, plain = in_place.twice(architectures.MODELS[name])
    in_place.wrap_in_place(model)
    x, _ = architectures.data(name, 1)
    x = architectures.batch(x, 0)
    in_place.assert_same_outputs(model, plain, x)
    path = tmp_path / f"{name}.keras"
    model.save(path)
    reloaded = keras.saving.load_model(path)
    assert "keras_als" not in json.dumps(reloaded.get_config(), default=str)
    np.testing.assert_array_equal(in_place.outputs(reloaded, x), in_place.outputs(plain, x))


def _recording_plans(optimizer):
    """Makes `optimizer.scale_loss` record the plan it makes in each traced
    step; returns the list it appends to."""
    plans, scale_loss = [], optimizer.scale_loss

    def recording(loss):
        scaled = scale_loss(loss)
        plans.append(_step_record.plan_now(optimizer))
        return scaled

    optimizer.scale_loss = recording
    return plans


# XLA compiles of the keras.applications models take minutes on 2 cores: those
# two train as TensorFlow graphs here (XLA exactness is in test_invariant.py).
JIT = {"mobilenet_v2": False, "resnet50_v2": False, "gpt2_tiny": True, "bert_tiny": True}


def _assert_one_variable_more_than_keras_s(optimizer, model):
    """keras_als's optimizer holds Keras's `LossScaleOptimizer`'s variables
    (built on the same weights) and one more, `scale_state`, with an entry for
    the loss and one per trainable variable; it names a scale for the loss and
    for each layer with weights, nested projections included."""
    theirs = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    theirs.build(model.trainable_variables)

    def names(o):
        return [v.path.split("/")[-1] for v in o.variables]

    assert sorted(names(optimizer)) == sorted([*names(theirs), "scale_state"])
    assert sorted(optimizer.layer_scales()) == sorted(["loss", *models.scale_names(model)])
    assert len(optimizer.layer_scales()) - 1 == len(models.scaled_layers(model)) >= 7
    entries = 1 + len(model.trainable_variables)
    table = len(_state.PER_SCALE) * entries
    assert optimizer.scale_state.shape == (table + _state.COUNTED,)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALL)
def test_chosen_scales_and_scale_one_train_bit_identically_in_float32(name):
    """float32, Adam, 3 steps, in TensorFlow graphs (XLA's exactness is
    test_invariant.py's, on seven shapes with a Transformer block): the
    scales keras_als chooses (which differ between layers) and scale 1
    everywhere give bit-identical weights (powers of two scale exactly).
    After the steps, its optimizer adds one variable to Keras's whatever its
    scales (the README's claim, on real nets); and on the CNNs the traced
    step has at least as many scale components as layers owning trainable
    weights (joins get boundaries, so ResNet50V2's identity shortcuts do not
    merge the layers along its trunk into one scale)."""
    x, y = architectures.data(name, 3)
    weights = {}
    for policy in ("max_safe", policies.Fixed(default=1.0)):
        keras.utils.clear_session()
        keras.utils.set_random_seed(0)
        model = keras_als.wrap_model(architectures.MODELS[name]())
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.Adam(1e-3), policy=policy, measure_every_n_steps=1
        )
        plans = _recording_plans(optimizer)
        in_place.train(model, optimizer, x, y, steps=3, jit_compile=False)
        weights[str(policy)] = [keras.ops.convert_to_numpy(w) for w in model.weights]
        if policy == "max_safe":
            assert len(set(optimizer.layer_scales().values())) > 1  # scales that differ
            _assert_one_variable_more_than_keras_s(optimizer, model)
            if name in CNNS:  # attention projections of one input share a component
                components = len(plans[-1].components)  # of the traced step's plan
                assert components >= len(models.scaled_layers(model)), components
    chosen, one = weights.values()
    for a, b in zip(chosen, one, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", FAST)
def test_one_step_unscaled_gradients_match_the_plain_model_within_float32_rounding(name):
    """float32, scales that differ from layer to layer (`per_layer_fixed`,
    set by two steps at learning rate 0; the plain model then takes the
    instrumented one's BatchNorm statistics): for each variable, the gradient
    keras_als unscales is within 1e-5 of that variable's largest plain
    gradient, plus 1e-6 of the largest over all variables (variables whose
    true gradient is zero hold only rounding noise), of a plain model's with
    the same weights: a wrong small layer fails. Both gradients are computed
    with XLA for the KerasHub models and in a TensorFlow graph for
    MobileNetV2 (`JIT`: its two XLA compiles took 100 s of the test's 156)."""
    model, plain = in_place.twice(architectures.MODELS[name])
    keras_als.wrap_model(model)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.0), policy=models.per_layer_fixed(model, default=1.0)
    )
    inputs, labels = architectures.data(name, 2)
    # A TensorFlow graph here, which spares one XLA compile of the model.
    in_place.train(model, optimizer, inputs, labels, steps=2, jit_compile=False)
    x, y = architectures.batch(inputs, 0), labels[: architectures.BATCH]
    assert len(set(optimizer.layer_scales().values())) > 2, optimizer.layer_scales()
    # Training moved BatchNorm's moving statistics in the instrumented model only.
    plain.set_weights(model.get_weights())

    def loss_of(m):
        return tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(y, m(x, training=False), from_logits=True)
        )

    expected = models.traced_gradients(plain, loss_of, jit_compile=JIT[name])
    actual = models.traced_gradients(model, loss_of, optimizer, jit_compile=JIT[name])
    variables = model.trainable_variables
    worst = models.assert_gradients_match(actual, expected, variables, 1e-5, of_largest=1e-6)
    print(f"{name}: worst error / bound, keras_als vs plain: {worst:.2e}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_tiny", "mobilenet_v3_small"])
def test_the_instrumented_model_with_keras_optimizer_hands_xla_the_plain_models_program(name):
    """mixed_float16, XLA, Keras's LossScaleOptimizer: the HLO the instrumented
    model's training step hands XLA is the plain model's: the same computations,
    instruction for instruction, and the same instructions in its entry, with
    names, metadata, the order of its parameters and instructions whose results
    nothing reads aside (`programs.same_program`; XLA removes those first).
    Instrumenting alone adds nothing to the compiled step; keras_als's cost is
    its optimizer's and the factors its plan hands the boundaries
    (`--parts graph` compares the optimized HLO of the four real models). The
    HLO before XLA's optimizations is four times faster to get than after."""
    plain = programs.compiled_step(name, "keras", stage="hlo")
    wrapped = programs.compiled_step(name, "keras", wrap=True, stage="hlo")
    assert plain != wrapped  # the names differ: the comparison must look past them
    assert programs.same_program(plain, wrapped)
    # One instruction changed is another program.
    assert not programs.same_program(plain, wrapped.replace(" multiply(", " add(", 1))


# Steps after the first 50 in the skip test: the benchmark runs 1,000 on every
# model; here the CNN runs 50. ResNet50V2's run, the longest test of the suite
# (two XLA compiles of 23M weights and 150 steps: 435 s of a worker), is left
# to the benchmark (`python -m benchmarks.real_models --parts skips`); the
# suite checks a BatchNorm CNN on MobileNetV2 and one without normalization
# on VGG16, both in TensorFlow graphs: one XLA compile of MobileNetV2 takes
# about 80 s on 2 cores, the whole run in a graph about as long, and the
# benchmark's runs of the CNNs are compiled with XLA.
STEPS_AFTER_50 = {"gpt2_tiny": 1000, "bert_tiny": 1000, "mobilenet_v2": 50}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(STEPS_AFTER_50))
def test_keras_als_skips_no_more_than_keras_in_the_first_50_steps_and_at_most_1_after(name):
    """The benchmark's skip run (`skips.skip_trace`: mixed_float16, Adam,
    batch 8, the same weights and batches; XLA for the KerasHub models, a
    TensorFlow graph for MobileNetV2, `JIT`): over the first 50 steps
    keras_als skips at most as many steps as Keras's LossScaleOptimizer on the
    same 50 batches, and at most 1 of the `STEPS_AFTER_50` after (issue 12's
    target is 1 per 1,000); its losses stay finite; and over 1,050 steps it
    measures its scales on at most one step in ten (the period grows while
    scales hold)."""
    steps = 50 + STEPS_AFTER_50[name]
    keras_run = skips.skip_trace(name, "keras", 50, batches=steps, jit=JIT[name])
    keras.utils.clear_session()
    run = skips.skip_trace(name, "keras_als", steps, jit=JIT[name])
    keras.config.set_dtype_policy("float32")
    first_50 = {"keras": keras_run.skipped[-1], "keras_als": run.skipped[49]}
    after = run.skipped[-1] - run.skipped[49]
    print(name, "skipped in the first 50:", first_50, "after:", after)
    print(name, "measured on", len(run.measured), "of", steps, "steps")
    assert first_50["keras_als"] <= first_50["keras"], first_50
    assert after <= 1, run.skipped
    if steps >= 1050:
        assert len(run.measured) <= steps // 10, run.measured
    assert all(np.isfinite(run.losses))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(architectures.OTHER_FAMILIES))
def test_other_models_of_the_same_families_keep_every_weight_and_compute_the_same_outputs(name):
    """Instrumented in place, each keeps every weight object, path and order,
    its class and config, and computes a plain model's outputs (same weights)
    within float32 rounding; every layer with weights gets a scale."""
    model, plain = in_place.twice(architectures.OTHER_FAMILIES[name])
    in_place.wrap_in_place(model)
    x, _ = architectures.data(name, batches=1)  # the benchmark's inputs for this model
    in_place.assert_same_outputs(model, plain, x)


def _llama():
    import keras_hub

    return architectures.mean_pooled(
        keras_hub.models.LlamaBackbone(
            vocabulary_size=128,
            num_layers=2,
            num_query_heads=2,
            num_key_value_heads=1,
            hidden_dim=32,
            intermediate_dim=64,
        )
    )


@pytest.mark.slow
def test_a_llama_backbone_whose_layer_configs_do_not_round_trip_wraps_in_place_and_trains():
    """KerasHub 0.32's Llama decoder layer cannot be rebuilt from its config
    (its get_config reads an attribute it never sets), so
    `keras.models.clone_model` fails on the backbone; instrumenting in place
    rebuilds no layer: no warning, every weight, class and config kept, the
    plain model's outputs, a scale for every layer with weights (the
    projections inside each decoder block included), and under
    mixed_float16 with XLA the loss falls with at most one step skipped."""
    model, plain = in_place.twice(_llama)
    try:
        keras.models.clone_model(next(x for x in plain.layers if isinstance(x, keras.Model)))
        print("this KerasHub's Llama layers round-trip their configs")
    except Exception as error:
        print("clone_model fails on the Llama backbone:", type(error).__name__)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        in_place.wrap_in_place(model)
    x = {key: np.ones((2, architectures.SEQUENCE), "int32") for key in model.input}
    in_place.assert_same_outputs(model, plain, x)
    assert len(models.scaled_layers(model)) >= 2 * 7  # q, k, v, o and three feed-forward per block

    keras.config.set_dtype_policy("mixed_float16")
    try:
        keras.utils.set_random_seed(0)
        model = keras_als.wrap_model(_llama())
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            jit_compile=True,
        )
        rng = np.random.default_rng(0)
        tokens = rng.integers(1, 128, (8, architectures.SEQUENCE)).astype("int32")
        inputs = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
        labels = rng.integers(0, 2, 8)
        losses = [model.train_on_batch(inputs, labels) for _ in range(4)]
    finally:
        keras.config.set_dtype_policy("float32")
    assert len(optimizer.layer_scales()) - 1 == len(models.scaled_layers(model))
    assert int(optimizer.skipped_steps.numpy()) <= 1
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]


@pytest.mark.slow
def test_vgg16_without_normalization_skips_no_more_steps_than_keras_in_its_first_25():
    """VGG16 at 32x32 has no normalization layer: under Adam its first blocks'
    gradients grow about 2**11-fold over its first 20 steps, faster than a
    fixed measuring period follows (it skipped step 10 that way; Keras none).
    `benchmarks.profiles.wrap_sweep`'s run, mixed_float16, XLA, batch 8, the same
    weights and batches (the sweep runs 50 steps): every weight kept and the
    plain model's outputs after instrumenting, and over the first 25 steps,
    which hold that growth, keras_als skips at most as many as Keras's
    LossScaleOptimizer. With XLA, a step of VGG16 takes about 0.5 s on
    2 cores, after about 10 s of compiling; in a TensorFlow graph, where
    TensorFlow's CPU kernels compute its float16 convolutions, about 23 s."""
    row = wrap_sweep.try_model(lambda: wrap_sweep.application("VGG16"), steps=25)
    print(row)
    assert "error" not in row, row
    assert row["weights_equal"] and row["outputs_equal"], row
    assert row["keras_als"] <= row["keras"], row


@pytest.mark.slow
def test_on_a_llama_backbone_keras_writes_nan_into_the_embedding_and_keras_als_does_not():
    """The README's reading of the sweep's Llama rows, on the backbone itself:
    a tiny KerasHub Llama backbone, `benchmarks.profiles.wrap_sweep`'s run over its
    first 12 steps (mixed_float16, XLA, batch 8, the same weights and batches).
    Keras's LossScaleOptimizer ends with a weight that holds a non-finite value
    (it applied a non-finite embedding gradient: `tests/test_faults.py`);
    keras_als ends with every weight finite, skipping at most as many steps.
    If Keras fixes its check, the first assertion fails: update the README."""

    def llama():
        return architectures.mean_pooled(wrap_sweep.tiny_backbone("LlamaBackbone"))

    row = wrap_sweep.try_model(llama, steps=12)
    print(row)
    assert "error" not in row, row
    assert row["weights_equal"] and row["outputs_equal"], row
    assert row["weights_not_finite"]["keras"] >= 1, row
    assert row["weights_not_finite"]["keras_als"] == 0, row
    assert row["keras_als"] <= row["keras"], row
