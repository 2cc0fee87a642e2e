"""wrap_model instruments the user's own model in place: same object, same
function, boundaries where each layer with weights and each join needs one."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import keras_als
from keras_als.instrument import hook_of
from tests import models


def _describe(model):
    nested = [(type(layer), layer.name) for layer in models.all_layers(model)]
    return models.description(model) | {"layers": nested}


@pytest.mark.parametrize("shape", sorted(models.ALL_SHAPES))
def test_wrap_model_returns_the_same_model_with_its_class_config_weights_and_summary(shape):
    model, x, _ = models.ALL_SHAPES[shape]()
    before, outputs = _describe(model), model.predict(x, verbose=0)
    weights = list(model.weights)
    assert keras_als.wrap_model(model) is model
    assert _describe(model) == before
    assert all(a is b for a, b in zip(model.weights, weights, strict=True))
    for a, b in zip(keras.tree.flatten(model.predict(x, verbose=0)), keras.tree.flatten(outputs)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("shape", sorted(models.ALL_SHAPES))
def test_one_traced_step_gives_the_gradients_of_the_plain_model(shape):
    """Unscaled gradients equal the plain model's within float32 rounding
    (1e-6 relative to each variable's largest gradient), per variable."""
    model, x, y = models.ALL_SHAPES[shape]()
    plain = models.copy_of(model)
    keras_als.wrap_model(model, scale_each_output=shape == "two_outputs")
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.0), policy=models.per_layer_fixed(model)
    )
    model.compile(optimizer, models.loss_for(model))
    for _ in range(2):  # the policy sets its scales on the first steps (learning rate 0)
        model.train_on_batch(x[:16], keras.tree.map_structure(lambda t: t[:16], y))
    assert len(set(optimizer.layer_scales().values())) > 2, optimizer.layer_scales()

    def loss_of(m):
        outputs = keras.tree.flatten(m(x[:16], training=True))
        targets = keras.tree.flatten(y)
        errors = [tf.square(tf.cast(o, "float32") - t[:16]) for o, t in zip(outputs, targets)]
        return tf.add_n([tf.reduce_mean(e) for e in errors])

    expected = models.traced_gradients(plain, loss_of)
    for a, e in zip(models.traced_gradients(model, loss_of, optimizer), expected, strict=True):
        assert np.max(np.abs(a - e)) <= 1e-6 * max(np.max(np.abs(e)), 1e-30)


def test_boundaries_go_at_layers_with_weights_and_at_joins_only():
    model, x, _ = models.fan_out_concat()
    keras_als.wrap_model(model)
    owners = models.boundary_owners(model, x[:2])
    with_weights = [layer.path for layer in model.layers if layer.weights]
    joins = [layer.path for layer in model.layers if isinstance(layer, layers.Concatenate)]
    assert sorted(set(owners)) == sorted(with_weights + joins)
    assert owners.count(joins[0]) == 2  # one boundary per input of the join


def test_a_weightless_layer_on_one_tensor_gets_no_boundary():
    inputs = keras.Input((4,))
    hidden = layers.Activation("relu")(layers.Dense(4, name="dense")(inputs))
    model = keras_als.wrap_model(keras.Model(inputs, layers.Dropout(0.1)(hidden)))
    assert models.boundary_owners(model, np.ones((2, 4), "float32")) == ["dense"]


def test_layers_nested_in_custom_layers_get_scales_of_their_own():
    """The query, key, value and output projections inside MultiHeadAttention
    (a layer without weights of its own) each get a boundary and a scale."""
    model, x, y = models.transformer_block()
    keras_als.wrap_model(model)
    owners = {path.split("/")[-1] for path in models.boundary_owners(model, x[:2])}
    assert {"query", "key", "value", "attention_output"} <= owners
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer, "mse")
    model.fit(x, y, epochs=1, verbose=0)
    assert {"query", "key", "value", "attention_output"} <= set(optimizer.layer_scales())


def test_scale_names_are_the_shortest_unique_path_suffixes():
    class Block(layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.proj = layers.Dense(4, name="proj")

        def call(self, x):
            return self.proj(x)

    inputs = keras.Input((4,))
    hidden = Block(name="b1")(Block(name="b0")(inputs))
    model = keras_als.wrap_model(keras.Model(inputs, layers.Dense(4, name="head")(hidden)))
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer, "mse")
    model.fit(np.ones((4, 4)), np.ones((4, 4)), verbose=0)
    assert list(optimizer.layer_scales()) == ["loss", "b0/proj", "b1/proj", "head"]


def test_wrapping_twice_is_wrapping_once_and_unwrap_model_removes_every_boundary():
    model, x, _ = models.residual_cnn()
    once = models.boundary_owners(keras_als.wrap_model(model), x[:2])
    assert models.boundary_owners(keras_als.wrap_model(model), x[:2]) == once
    assert keras_als.unwrap_model(model) is model
    assert models.boundary_owners(model, x[:2]) == []
    assert all(hook_of(layer) is None and "call" not in vars(layer) for layer in model.layers)


def test_a_subclassed_model_wraps_in_place_and_trains_with_layer_wise_scales():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = layers.Dense(8, activation="sigmoid", name="hidden")
            self.out = layers.Dense(1, name="out")

        def call(self, x):
            return self.out(self.hidden(x))

    model = keras_als.wrap_model(Subclassed())  # not built: wrapped all the same
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(32, 4)), rng.normal(size=(32, 1)), epochs=2, verbose=0)
    assert type(model) is Subclassed
    assert set(optimizer.layer_scales()) == {"loss", "hidden", "out"}


def test_layers_inside_an_adaptive_scaled_are_left_to_it():
    inputs = keras.Input((3,))
    wrapped = keras_als.AdaptiveScaled(layers.Dense(2, name="inner"))
    model = keras_als.wrap_model(keras.Model(inputs, layers.Dense(1, name="head")(wrapped(inputs))))
    assert hook_of(wrapped.layer) is None and hook_of(wrapped) is None
    assert sorted(models.boundary_owners(model, np.ones((2, 3), "float32"))) == ["head", "inner"]


def test_a_layer_or_anything_else_gets_an_error_naming_what_to_wrap():
    with pytest.raises(TypeError, match=r"got a layer \(Dense\).*AdaptiveScaled\(layer\)"):
        keras_als.wrap_model(layers.Dense(3))
    with pytest.raises(TypeError, match="keras.Model"):
        keras_als.wrap_model("model")


def test_wrapping_a_compiled_model_that_has_trained_retraces_its_step():
    model, x, y = models.sequential_mlp()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01))
    model.compile(optimizer, "mse")
    model.fit(x, y, epochs=1, verbose=0)
    assert set(optimizer.layer_scales()) == {"loss"}
    keras_als.wrap_model(model)
    model.fit(x, y, epochs=1, verbose=0)
    assert len(optimizer.layer_scales()) == 1 + len([w for w in model.layers if w.weights])


def test_masks_cross_the_boundaries():
    tokens = keras.Input((6,), dtype="int32")
    embedded = layers.Embedding(20, 8, mask_zero=True)(tokens)
    model = keras.Model(tokens, layers.Dense(1)(layers.LSTM(5)(embedded)))
    plain = models.copy_of(model)
    keras_als.wrap_model(model)
    x = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 0, 0, 0, 0]], "int32")
    traced = tf.function(lambda x: model(x))
    np.testing.assert_allclose(traced(x), plain(x), rtol=1e-6)
    unmasked = keras.Model(tokens, layers.Dense(1)(layers.LSTM(5)(layers.Embedding(20, 8)(tokens))))
    unmasked.set_weights(model.get_weights())
    assert np.max(np.abs(unmasked(x) - plain(x))) > 1e-4  # the mask matters here


def test_weights_saved_from_the_plain_model_load_by_path_into_the_wrapped_one(tmp_path):
    model, x, _ = models.layer_shared_with_a_nested_model()
    path = str(tmp_path / "plain.weights.h5")
    model.save_weights(path)
    fresh = keras_als.wrap_model(models.layer_shared_with_a_nested_model()[0])
    fresh.load_weights(path)
    np.testing.assert_array_equal(fresh(x), model(x))
    assert fresh.get_layer("shared") is fresh.get_layer("inner").get_layer("shared")


@pytest.mark.parametrize("order", ["before", "after"])
def test_a_layer_dtype_policy_set_before_or_after_wrapping_is_the_one_it_computes_in(order):
    """Under mixed_float16, the head set to float32 before or after `wrap_model`
    computes in float32 and keeps its scale; one traced step's unscaled
    gradients, at scales from 2**8 to 2**14 that differ from layer to layer,
    are as near the float32 model's as the plain model's (same policies, its
    loss scaled by 2**12), within 10% of its error plus float16's precision
    (`models.assert_as_near_float32_as_plain`: a float16 gradient is no
    reference, its rounding depends on the CPU)."""
    keras.config.set_dtype_policy("mixed_float16")
    try:
        model, x, y = models.transformer_block()
        head = model.layers[-1]
        if order == "before":
            head.dtype_policy = "float32"
        plain = models.copy_of(model)
        plain.layers[-1].dtype_policy = "float32"
        keras_als.wrap_model(model)
        if order == "after":
            head.dtype_policy = "float32"
        assert head.compute_dtype == "float32" and model(x[:2]).dtype == "float32"
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.SGD(0.0), policy=models.per_layer_fixed_in_float16(model)
        )
        model.compile(optimizer, "mse")
        for _ in range(2):  # the policy sets its scales on the first steps (learning rate 0)
            model.train_on_batch(x[:16], y[:16])
        assert len(set(optimizer.layer_scales().values())) > 2, optimizer.layer_scales()
        assert head.name in optimizer.layer_scales()

        def loss_of(m):
            error = tf.cast(m(x[:16], training=True), "float32") - y[:16]
            return tf.reduce_mean(tf.square(error))

        got = models.traced_gradients(model, loss_of, optimizer)
        want = models.traced_gradients(plain, loss_of, scale=2.0**12)
    finally:
        keras.config.set_dtype_policy("float32")
    reference = models.copy_of(plain)
    for layer in reference._flatten_layers(include_self=False):
        layer.dtype_policy = "float32"
    exact = models.traced_gradients(reference, loss_of)
    models.assert_as_near_float32_as_plain(got, want, exact, model.trainable_variables)


def test_a_skipped_step_leaves_batch_norm_statistics_and_frozen_weights_as_they_were():
    inputs = keras.Input((4,))
    frozen = layers.Dense(4, name="frozen", trainable=False)
    hidden = layers.BatchNormalization(name="norm")(frozen(inputs))
    model = keras_als.wrap_model(keras.Model(inputs, layers.Dense(1, name="head")(hidden)))
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer, "mse")
    before = [np.array(w) for w in model.weights]
    x = np.ones((8, 4), "float32")
    model.fit(x, np.full((8, 1), np.inf, "float32"), epochs=1, verbose=0)  # loss not finite
    assert int(optimizer.skipped_steps.numpy()) == 1
    for a, b in zip(model.weights, before):
        np.testing.assert_array_equal(np.array(a), b)


def test_scale_each_output_gives_each_head_a_scale_and_float32_outputs(tmp_path):
    model, x, y = models.two_outputs()
    keras_als.wrap_model(model, scale_each_output=True)
    outputs = tf.function(lambda x: model(x))(x[:2])
    assert [o.dtype.name for o in outputs] == ["float32", "float32"]
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam())
    model.compile(optimizer, ["mse", "mse"])
    model.fit(x, y, epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    restored = keras_als.wrap_model(keras.saving.load_model(tmp_path / "model.keras"), True)
    assert restored.optimizer.layer_scales() == optimizer.layer_scales()
    assert {"first", "second"} <= set(optimizer.layer_scales())


def _head_gradients(model, optimizer, x, targets, box_weight):
    """Unscaled gradients of a classes+box loss after 30 steps at learning rate 0
    (the scales settle; the weights do not move)."""

    @tf.function(jit_compile=True)
    def step():
        with tf.GradientTape() as tape:
            classes, box = model(x, training=True)
            loss = tf.reduce_mean(tf.square(tf.cast(classes, tf.float32) - targets[0]))
            loss += box_weight * tf.reduce_mean(tf.square(tf.cast(box, tf.float32) - targets[1]))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        if isinstance(optimizer, keras_als.AdaptiveLossScaleOptimizer):
            return optimizer.unscale(grads, model.trainable_variables)
        return grads

    for _ in range(30):
        gradients = step()
    return [np.asarray(tf.convert_to_tensor(g), "float32") for g in gradients]


@pytest.mark.parametrize("scale_each_output", [False, True])
def test_scale_each_output_keeps_a_small_loss_head_from_flushing_in_float16(scale_each_output):
    # Two float16 heads on one trunk; the box loss is 2**40 times the class
    # loss. Sharing the loss's scale (which must hold the box gradients), the
    # class head's weight gradients flush to zero in float16; with a scale per
    # output they match float32 within float16 rounding.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 8)).astype("float32")
    targets = (
        rng.normal(size=(32, 4)).astype("float32"),
        rng.normal(size=(32, 1)).astype("float32"),
    )

    def two_heads():
        inputs = keras.Input((8,))
        trunk = layers.Dense(16, activation="tanh", name="trunk")(inputs)
        heads = [layers.Dense(4, name="classes")(trunk), layers.Dense(1, name="box")(trunk)]
        return keras.Model(inputs, heads)

    plain = two_heads()
    reference = _head_gradients(plain, keras.optimizers.SGD(0.0), x, targets, 2.0**40)
    keras.config.set_dtype_policy("mixed_float16")
    try:
        half = two_heads()
        half.set_weights(plain.get_weights())
        wrapped = keras_als.wrap_model(half, scale_each_output=scale_each_output)
        assert wrapped is half
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.0))
        measured = _head_gradients(wrapped, optimizer, x, targets, 2.0**40)
    finally:
        keras.config.set_dtype_policy("float32")
    kernel = [v.path for v in wrapped.trainable_variables].index("classes/kernel")
    error = np.linalg.norm(measured[kernel] - reference[2]) / np.linalg.norm(reference[2])
    scales = optimizer.layer_scales()
    if scale_each_output:
        assert error < 1e-2, (error, scales)
        assert scales["classes"] > scales["box"] * 2.0**20, scales
    else:
        assert np.all(measured[kernel] == 0), (error, scales)
        assert scales["classes"] == scales["box"] == scales["loss"], scales
