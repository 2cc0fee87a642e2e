"""AdaptiveScaled and wrap_model: same function, same weights, no surprises."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import keras_als
from tests import models


def _single_layer_model(kind):
    rng = np.random.default_rng(3)
    if kind == "Embedding":
        inputs = keras.Input((6,), dtype="int32")
        x = rng.integers(0, 20, size=(4, 6)).astype("int32")
        return keras.Model(inputs, layers.Embedding(20, 5)(inputs)), x
    shapes = {"Conv1D": (10, 3), "Conv2D": (6, 6, 3), "MultiHeadAttention": (5, 8)}
    inputs = keras.Input(shapes.get(kind, (7,)))
    make = {
        "Dense": lambda: layers.Dense(4),
        "Conv1D": lambda: layers.Conv1D(4, 3),
        "Conv2D": lambda: layers.Conv2D(4, 3),
        "BatchNormalization": lambda: layers.BatchNormalization(),
        "LayerNormalization": lambda: layers.LayerNormalization(),
    }
    if kind == "MultiHeadAttention":
        outputs = layers.MultiHeadAttention(num_heads=2, key_dim=4)(inputs, inputs)
    else:
        outputs = make[kind]()(inputs)
    x = rng.normal(size=(4, *shapes.get(kind, (7,)))).astype("float32")
    return keras.Model(inputs, outputs), x


LAYER_KINDS = [
    "Dense",
    "Conv1D",
    "Conv2D",
    "BatchNormalization",
    "LayerNormalization",
    "Embedding",
    "MultiHeadAttention",
]


@pytest.mark.parametrize("kind", LAYER_KINDS)
def test_wrapped_layer_computes_the_same_outputs_and_gradients(kind):
    model, x = _single_layer_model(kind)
    wrapped = keras_als.wrap_model(model)
    assert isinstance(wrapped.layers[-1], keras_als.AdaptiveScaled)
    np.testing.assert_array_equal(wrapped(x, training=False), model(x, training=False))

    def gradients(m):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(m(x, training=True)))
        return tape.gradient(loss, m.trainable_variables)

    for a, b in zip(gradients(wrapped), gradients(model), strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), rtol=1e-6)


def test_wrap_model_copies_weights_without_sharing_them():
    model, x, _ = models.sequential_mlp()
    wrapped = keras_als.wrap_model(model)
    np.testing.assert_array_equal(wrapped.predict(x, verbose=0), model.predict(x, verbose=0))
    wrapped.layers[0].layer.kernel.assign(np.zeros_like(wrapped.layers[0].layer.kernel))
    assert np.any(model.layers[0].kernel.numpy() != 0)


def test_summary_counts_the_same_parameters():
    model, _, _ = models.residual_cnn()
    wrapped = keras_als.wrap_model(model)
    assert wrapped.count_params() == model.count_params()
    assert len(wrapped.non_trainable_weights) == len(model.non_trainable_weights)
    lines = []
    wrapped.summary(print_fn=lambda line, **_: lines.append(line))
    text = "\n".join(lines)
    names = [layer.name for layer in model.layers]
    assert [layer.name for layer in wrapped.layers] == names
    assert "AdaptiveScaled" in text and "conv2d" in text and "_scaled" not in text


def test_wrap_model_keeps_input_names_and_wraps_weights_and_joins_only():
    model, _, _ = models.fan_out_concat()
    wrapped = keras_als.wrap_model(model)
    kinds = [type(layer).__name__ for layer in wrapped.layers]
    # Four layers with weights, and the Concatenate that joins two branches.
    assert kinds.count("AdaptiveScaled") == 5
    joins = [w.layer for w in wrapped.layers if isinstance(w, keras_als.AdaptiveScaled)]
    assert [type(j).__name__ for j in joins if not j.weights] == ["Concatenate"]
    assert wrapped.layers[0].name == model.layers[0].name


def test_wrapped_model_keeps_layer_and_output_names_for_loss_dicts_and_history():
    inputs = keras.Input((4,))
    trunk = layers.Dense(8, name="trunk")(inputs)
    model = keras.Model(
        inputs, [layers.Dense(2, name="classes")(trunk), layers.Dense(1, name="box")(trunk)]
    )
    wrapped = keras_als.wrap_model(model)
    assert wrapped.output_names == model.output_names == ["classes", "box"]
    assert isinstance(wrapped.get_layer("trunk"), keras_als.AdaptiveScaled)
    x = np.ones((8, 4), "float32")
    y = {"classes": np.zeros((8, 2), "float32"), "box": np.zeros((8, 1), "float32")}
    histories = []
    for m, optimizer in (
        (model, keras.optimizers.Adam()),
        (wrapped, keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam())),
    ):
        m.compile(optimizer, loss={"classes": "mse", "box": "mae"}, metrics={"box": ["mae"]})
        histories.append(m.fit(x, y, epochs=1, verbose=0).history)
    assert sorted(histories[1]) == sorted(histories[0])
    assert set(wrapped.optimizer.layer_scales()) == {"loss", "trunk", "classes", "box"}


def test_a_weightless_layer_on_one_tensor_stays_unwrapped():
    inputs = keras.Input((4,))
    hidden = layers.Activation("relu")(layers.Dense(4)(inputs))
    wrapped = keras_als.wrap_model(keras.Model(inputs, layers.Dropout(0.1)(hidden)))
    assert [type(w).__name__ for w in wrapped.layers] == [
        "InputLayer",
        "AdaptiveScaled",
        "Activation",
        "Dropout",
    ]


def test_wrap_model_wraps_inside_nested_models():
    inner = keras.Sequential([keras.Input((5,)), layers.Dense(5, activation="relu")], name="inner")
    inputs = keras.Input((5,))
    model = keras.Model(inputs, layers.Dense(2)(inner(inputs)))
    wrapped = keras_als.wrap_model(model)
    nested = [layer for layer in wrapped.layers if isinstance(layer, keras.Sequential)]
    assert len(nested) == 1 and isinstance(nested[0].layers[0], keras_als.AdaptiveScaled)
    x = np.ones((3, 5), "float32")
    np.testing.assert_allclose(wrapped(x), model(x), rtol=1e-6)


def test_a_layer_shared_with_a_nested_model_stays_one_layer_and_its_weights_save(tmp_path):
    """The copy calls one `shared` layer inside the nested model and around it,
    as the original does (`keras.models.clone_model` would make two), and its
    weights go through `save_weights` into a fresh wrap of the same model."""
    model, x, _ = models.layer_shared_with_a_nested_model()
    wrapped = keras_als.wrap_model(model)
    assert len(wrapped.weights) == len(model.weights)
    inner = wrapped.get_layer("inner")
    assert wrapped.get_layer("shared") is inner.get_layer("shared")
    np.testing.assert_array_equal(wrapped(x), model(x))
    path = str(tmp_path / "shared.weights.h5")
    wrapped.save_weights(path)
    fresh = keras_als.wrap_model(models.layer_shared_with_a_nested_model()[0])
    fresh.load_weights(path)
    np.testing.assert_array_equal(fresh(x), wrapped(x))


@pytest.mark.xfail(
    strict=True,
    raises=ValueError,
    reason="Keras 3.15 makes a layer shared with a nested model twice in from_config; "
    "if this passes, Keras loads such graphs: update wrap_model's docstring and the guide",
)
def test_keras_loads_a_model_whose_layer_is_shared_with_a_nested_model(tmp_path):
    model, x, _ = models.layer_shared_with_a_nested_model()
    model.save(tmp_path / "plain.keras")
    np.testing.assert_array_equal(keras.saving.load_model(tmp_path / "plain.keras")(x), model(x))


def test_wrapping_twice_wraps_nothing_more():
    model, _, _ = models.sequential_mlp()
    twice = keras_als.wrap_model(keras_als.wrap_model(model))
    assert all(type(layer.layer) is not keras_als.AdaptiveScaled for layer in twice.layers)
    with pytest.raises(ValueError, match="already wrapped"):
        keras_als.AdaptiveScaled(twice.layers[0])


def test_a_layer_after_keras_ops_arithmetic_with_a_number_wraps_and_trains():
    """`x * 0.5` on a symbolic tensor gives one Keras marks sparse (MobileNetV3's
    hard-sigmoid, Gemma's embedding scale); the plain Conv2D never traces its call
    there (it has its own output shape), and neither may the wrapped one."""
    inputs = keras.Input((6, 6, 3))
    hidden = layers.Conv2D(4, 3, padding="same", name="first")(inputs)
    scaled = hidden * 0.5
    assert scaled.sparse  # the Keras behaviour this guards against
    outputs = layers.Conv2D(2, 1, name="second")(scaled)
    model = keras.Model(inputs, outputs)
    wrapped = keras_als.wrap_model(model)
    assert [len(w.weights) for w in wrapped.layers[1:] if w.weights] == [2, 2]
    x = np.random.default_rng(0).normal(size=(2, 6, 6, 3)).astype("float32")
    np.testing.assert_array_equal(wrapped.predict(x, verbose=0), model.predict(x, verbose=0))
    wrapped.compile(
        optimizer=keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.01)), loss="mse"
    )
    wrapped.fit(x, np.zeros((2, 6, 6, 2)), epochs=1, verbose=0)
    assert sorted(wrapped.optimizer.layer_scales()) == ["first", "loss", "second"]


def test_a_layer_whose_config_does_not_round_trip_is_wrapped_itself_with_a_warning_naming_it():
    class Broken(layers.Dense):
        def get_config(self):
            raise AttributeError("no attribute 'forgotten'")

    inputs = keras.Input((3,))
    hidden = Broken(4, name="broken")(inputs)
    model = keras.Model(inputs, layers.Dense(2, name="head")(hidden))
    with pytest.warns(UserWarning, match=r"could not copy 1 layer\(s\).*'broken'.*forgotten"):
        wrapped = keras_als.wrap_model(model)
    broken, head = wrapped.get_layer("broken"), wrapped.get_layer("head")
    assert isinstance(broken, keras_als.AdaptiveScaled) and broken.layer is model.get_layer(
        "broken"
    )
    assert head.layer is not model.get_layer("head")  # the others are still copies
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    np.testing.assert_array_equal(wrapped.predict(x, verbose=0), model.predict(x, verbose=0))
    wrapped.compile(
        optimizer=keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1)), loss="mse"
    )
    wrapped.fit(x, np.ones((4, 2)), epochs=1, verbose=0)
    assert sorted(wrapped.optimizer.layer_scales()) == ["broken", "head", "loss"]


def test_weights_are_copied_layer_by_layer_where_the_model_lists_them_out_of_graph_order():
    """A subclass of Functional lists its weights in the order it tracked its
    layers as attributes (KerasHub's ESM2 and XLNet backbones do), its copy in
    graph order: copied in list order, each Dense here would get the other's
    kernel (the same shape) and the outputs would differ."""

    class AttributesFirst(keras.Model):
        def __init__(self, **kwargs):
            self.head = layers.Dense(3, name="head")  # tracked before the body
            self.body = layers.Dense(3, name="body")
            inputs = keras.Input((3,))
            super().__init__(inputs, self.head(self.body(inputs)), **kwargs)

    keras.utils.set_random_seed(0)
    model = AttributesFirst()
    if [w.path for w in model.weights][0] != "head/kernel":
        pytest.skip(
            f"Keras {keras.version()} lists this model's weights in graph order; Keras 3.15 "
            "and newer list them in the order the attributes were set, the case tested here"
        )
    wrapped = keras_als.wrap_model(model)
    for name in ("body", "head"):
        for original, copy in zip(model.get_layer(name).weights, wrapped.get_layer(name).weights):
            np.testing.assert_array_equal(np.asarray(copy), np.asarray(original))
    x = np.random.default_rng(0).normal(size=(4, 3)).astype("float32")
    np.testing.assert_array_equal(wrapped.predict(x, verbose=0), model.predict(x, verbose=0))


def test_subclassed_model_is_refused_with_the_way_to_do_it_by_hand():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model(np.ones((1, 3)))
    with pytest.raises(ValueError, match=r"keras_als\.AdaptiveScaled\(keras\.layers\.Dense"):
        keras_als.wrap_model(model)


def test_subclassed_model_with_wrapped_layers_trains_with_layer_wise_scales():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.hidden = keras_als.AdaptiveScaled(layers.Dense(8, activation="sigmoid"))
            self.out = keras_als.AdaptiveScaled(layers.Dense(1))

        def call(self, x):
            return self.out(self.hidden(x))

    model = Subclassed()
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.normal(size=(32, 4)), rng.normal(size=(32, 1)), epochs=2, verbose=0)
    assert set(optimizer.layer_scales()) == {"loss", "dense", "dense_1"}


def test_unbuilt_model_and_non_layers_get_clear_errors():
    with pytest.raises(ValueError, match="keras.Input"):
        keras_als.wrap_model(keras.Sequential([layers.Dense(2)]))
    with pytest.raises(TypeError, match="keras.layers.Layer"):
        keras_als.AdaptiveScaled("dense")


def test_adaptive_scaled_config_round_trip():
    wrapper = keras_als.AdaptiveScaled(layers.Dense(3, activation="relu", name="hidden"))
    wrapper.build((None, 4))
    config = wrapper.get_config()
    restored = keras_als.AdaptiveScaled.from_config(config)
    assert restored.get_config() == config
    assert restored.name == "hidden_scaled" and restored.layer.name == "hidden"
    serialized = keras.saving.serialize_keras_object(wrapper)
    assert type(keras.saving.deserialize_keras_object(serialized)) is keras_als.AdaptiveScaled


def test_wrapper_keeps_the_layer_dtype_policy():
    keras.config.set_dtype_policy("mixed_float16")
    try:
        head = layers.Dense(2, dtype="float32")
        wrapper = keras_als.AdaptiveScaled(head)
        assert wrapper.dtype_policy.name == "float32"
        assert keras_als.AdaptiveScaled(layers.Dense(2)).compute_dtype == "float16"
    finally:
        keras.config.set_dtype_policy("float32")


def test_masks_cross_the_wrapper_and_operations_are_not_wrapped():
    tokens = keras.Input((6,), dtype="int32")
    embedded = layers.Embedding(20, 8, mask_zero=True)(tokens)
    model = keras.Model(tokens, layers.Dense(1)(layers.LSTM(5)(embedded)))
    x = np.array([[1, 2, 3, 0, 0, 0], [4, 5, 0, 0, 0, 0]], "int32")
    wrapped = keras_als.wrap_model(model)
    np.testing.assert_allclose(wrapped(x), model(x), rtol=1e-6)
    unmasked = keras.Model(tokens, layers.Dense(1)(layers.LSTM(5)(layers.Embedding(20, 8)(tokens))))
    unmasked.set_weights(model.get_weights())
    assert np.max(np.abs(unmasked(x) - model(x))) > 1e-4  # the mask matters here


def test_an_embedding_of_token_ids_reports_the_scale_its_weights_get():
    tokens = keras.Input((8,), dtype="int32")
    h = layers.GlobalAveragePooling1D()(layers.Embedding(30, 6, name="embed")(tokens))
    model = keras_als.wrap_model(keras.Model(tokens, layers.Dense(1, name="head")(h)))
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    model.compile(optimizer=optimizer, loss="mse")
    rng = np.random.default_rng(0)
    model.fit(rng.integers(0, 30, (64, 8)), rng.normal(size=(64, 1)), epochs=2, verbose=0)
    scales = optimizer.layer_scales()
    assert scales["embed"] != optimizer.initial_scale  # planned, not left at its start value


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
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.0))
        measured = _head_gradients(wrapped, optimizer, x, targets, 2.0**40)
    finally:
        keras.config.set_dtype_policy("float32")
    kernel = [v.path for v in wrapped.trainable_variables].index("classes/classes/kernel")
    error = np.linalg.norm(measured[kernel] - reference[2]) / np.linalg.norm(reference[2])
    scales = optimizer.layer_scales()
    if scale_each_output:
        assert [str(t.dtype) for t in wrapped.outputs] == ["float32", "float32"]
        assert error < 1e-2, (error, scales)
        assert scales["classes"] > scales["box"] * 2.0**20, scales
    else:
        assert np.all(measured[kernel] == 0), (error, scales)
        assert scales["classes"] == scales["box"] == scales["loss"], scales


def test_scale_each_output_survives_a_keras_file(tmp_path):
    model, x, _ = models.two_outputs()
    wrapped = keras_als.wrap_model(model, scale_each_output=True)
    heads = [wrapped.get_layer(name) for name in model.output_names]
    assert [head.scale_outputs for head in heads] == [True, True]
    assert not wrapped.layers[1].scale_outputs
    wrapped.save(tmp_path / "model.keras")
    restored = keras.models.load_model(tmp_path / "model.keras")
    assert [restored.get_layer(name).scale_outputs for name in model.output_names] == [True, True]
    for a, b in zip(restored.predict(x, verbose=0), model.predict(x, verbose=0)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
