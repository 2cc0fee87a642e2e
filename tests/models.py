"""Small real Keras models of every shape the invariant must hold on.

Each builder returns `(model, x, y)`: a built model (not yet wrapped) and a
batch of data it trains on. `y` may be a list for several outputs.
"""

import json

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from keras_als import policies
from keras_als._keras_private import own_weights
from keras_als.step import _entries, _step_record


def _rng():
    return np.random.default_rng(7)


def sequential_mlp():
    model = keras.Sequential(
        [
            keras.Input((12,)),
            layers.Dense(32, activation="relu"),
            layers.Dense(32, activation="tanh"),
            layers.Dense(16, activation="relu"),
            layers.Dense(4),
        ]
    )
    rng = _rng()
    return (
        model,
        rng.normal(size=(64, 12)).astype("float32"),
        rng.normal(size=(64, 4)).astype("float32"),
    )


def residual_cnn():
    inputs = keras.Input((8, 8, 3))
    # No bias before BatchNormalization: its exact gradient is zero, so Adam
    # would turn the rounding noise of that gradient into full-size steps,
    # which differ with the order of reductions (XLA's, the boundaries').
    h = layers.Conv2D(8, 3, padding="same", use_bias=False)(inputs)
    h = layers.BatchNormalization()(h)
    h = layers.Activation("relu")(h)
    skip = h
    h = layers.Conv2D(8, 3, padding="same", use_bias=False)(h)
    h = layers.BatchNormalization()(h)
    h = layers.Activation("relu")(h)
    h = layers.Conv2D(8, 3, padding="same")(h)
    h = layers.Add()([h, skip])
    h = layers.GlobalAveragePooling2D()(h)
    outputs = layers.Dense(5)(h)
    rng = _rng()
    x = rng.normal(size=(32, 8, 8, 3)).astype("float32")
    y = rng.normal(size=(32, 5)).astype("float32")
    return keras.Model(inputs, outputs), x, y


def fan_out_concat():
    inputs = keras.Input((10,))
    shared = layers.Dense(16, activation="relu")(inputs)
    left = layers.Dense(8, activation="sigmoid")(shared)
    right = layers.Dense(8, activation="tanh")(shared)
    h = layers.Concatenate()([left, right])
    outputs = layers.Dense(3)(h)
    rng = _rng()
    return (
        keras.Model(inputs, outputs),
        rng.normal(size=(48, 10)).astype("float32"),
        rng.normal(size=(48, 3)).astype("float32"),
    )


def shared_layer():
    inputs = keras.Input((16,))
    h = layers.Dense(16, activation="relu")(inputs)
    twice = layers.Dense(16, activation="tanh")
    h = twice(twice(h))
    outputs = layers.Dense(2)(h)
    rng = _rng()
    return (
        keras.Model(inputs, outputs),
        rng.normal(size=(48, 16)).astype("float32"),
        rng.normal(size=(48, 2)).astype("float32"),
    )


def layer_shared_with_a_nested_model():
    """A layer called inside a nested model and again on the nested model's
    output, as a KerasHub causal LM calls its backbone's token embedding."""
    shared = layers.Dense(12, activation="tanh", name="shared")
    inner_inputs = keras.Input((12,))
    hidden = shared(inner_inputs)
    for _ in range(4):  # gradients shrink about 4x per sigmoid: scales that differ
        hidden = layers.Dense(12, activation="sigmoid")(hidden)
    inner = keras.Model(inner_inputs, hidden, name="inner")
    inputs = keras.Input((12,))
    outputs = layers.Dense(2)(shared(inner(inputs)))
    rng = _rng()
    return (
        keras.Model(inputs, outputs),
        rng.normal(size=(48, 12)).astype("float32"),
        rng.normal(size=(48, 2)).astype("float32"),
    )


def two_outputs():
    inputs = keras.Input((10,))
    h = layers.Dense(24, activation="relu")(inputs)
    first = layers.Dense(3, name="first")(layers.Dense(12, activation="relu")(h))
    second = layers.Dense(1, name="second")(h)
    rng = _rng()
    x = rng.normal(size=(48, 10)).astype("float32")
    y = [rng.normal(size=(48, 3)).astype("float32"), rng.normal(size=(48, 1)).astype("float32")]
    return keras.Model(inputs, [first, second]), x, y


def transformer_block(vocabulary=50, length=12, width=16):
    tokens = keras.Input((length,), dtype="int32")
    h = layers.Embedding(vocabulary, width)(tokens)
    attention = layers.MultiHeadAttention(num_heads=2, key_dim=8)(h, h)
    h = layers.LayerNormalization()(layers.Add()([h, attention]))
    feed = layers.Dense(width)(layers.Dense(32, activation="relu")(h))
    h = layers.LayerNormalization()(layers.Add()([h, feed]))
    outputs = layers.Dense(4)(layers.GlobalAveragePooling1D()(h))
    rng = _rng()
    x = rng.integers(0, vocabulary, size=(32, length)).astype("int32")
    y = rng.normal(size=(32, 4)).astype("float32")
    return keras.Model(tokens, outputs), x, y


def deep_sigmoid_mlp(depth=12, width=32, features=16):
    """Gradients shrink by about 4x per sigmoid layer: a range no single scale serves."""
    model = keras.Sequential(
        [keras.Input((features,))]
        + [layers.Dense(width, activation="sigmoid") for _ in range(depth)]
        + [layers.Dense(1)]
    )
    rng = _rng()
    x = rng.normal(size=(64, features)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    return model, x, y


ALL_SHAPES = {
    "sequential_mlp": sequential_mlp,
    "residual_cnn": residual_cnn,
    "fan_out_concat": fan_out_concat,
    "shared_layer": shared_layer,
    "layer_shared_with_a_nested_model": layer_shared_with_a_nested_model,
    "two_outputs": two_outputs,
    "transformer_block": transformer_block,
}


def copy_of(model):
    """An unwrapped copy of `model` with the same weights (the reference).

    A layer called both in a nested model and around it stays one layer
    (`keras.models.clone_model` alone would copy it twice).
    """
    made = {}

    def copy(layer):
        if id(layer) not in made:
            if isinstance(layer, keras.Model):
                made[id(layer)] = keras.models.clone_model(layer, clone_function=copy)
            else:
                made[id(layer)] = layer.__class__.from_config(layer.get_config())
        return made[id(layer)]

    clone = keras.models.clone_model(model, clone_function=copy)
    clone.set_weights(model.get_weights())
    return clone


def all_layers(model):
    """Every layer of `model` and of the models nested in it, depth first."""
    for layer in model.layers:
        yield layer
        if isinstance(layer, keras.Model):
            yield from all_layers(layer)


def description(model) -> dict:
    """What `wrap_model` must leave as it was: class, config, variable paths
    and `model.summary()`."""
    lines = []
    model.summary(print_fn=lambda line, **_: lines.append(line))
    return {
        "class": type(model),
        "config": json.dumps(model.get_config(), sort_keys=True, default=str),
        "paths": [w.path for w in model.weights],
        "summary": "\n".join(lines),
    }


def scaled_layers(model):
    """Layers of `model` at any depth that own trainable weights (each gets a scale)."""
    layers = model._flatten_layers(include_self=False)
    return [layer for layer in layers if any(w.trainable for w in own_weights(layer))]


def scale_names(model):
    """The names `AdaptiveLossScaleOptimizer.layer_scales()` gives the scaled layers of `model`."""
    owners = _entries.owners(model.trainable_variables)
    return _entries.names([owner.scale_path for owner, _ in owners])


def boundary_owners(model, x) -> list[str]:
    """The layer of every boundary a traced call of `model` on `x` places, by path."""
    graph = tf.function(lambda x: model(x, training=True)).get_concrete_function(x).graph
    return [b.owner.scale_path for b in _step_record.read(graph).boundaries]


def per_layer_fixed(wrapped, default=2.0**5):
    """A `Fixed` policy whose scales, 2**20 .. 2**-1, differ from one scaled
    layer of `wrapped` to the next (the loss's 2**-3, any other `default`)."""
    return policies.Fixed(
        default=default,
        scales={n: 2.0 ** (20 - 7 * (i % 4)) for i, n in enumerate(scale_names(wrapped))}
        | {"loss": 2.0**-3},
    )


def per_layer_fixed_in_float16(wrapped):
    """A `Fixed` policy whose scales, 2**8 .. 2**14, differ from one scaled
    layer of `wrapped` to the next (the loss's and any other 2**10): within
    float16's range, for gradients computed in float16."""
    return policies.Fixed(
        default=2.0**10,
        scales={n: 2.0 ** (8 + 2 * (i % 4)) for i, n in enumerate(scale_names(wrapped))}
        | {"loss": 2.0**10},
    )


def loss_for(model):
    return ["mse"] * len(model.outputs) if len(model.outputs) > 1 else "mse"


def traced_gradients(model, loss_of, optimizer=None, scale=1.0, jit_compile=False) -> list:
    """One traced step's gradients of `loss_of(model)` with respect to
    `model.trainable_variables`, as float32 arrays (None where a variable gets
    none).

    With a keras_als `optimizer`, the loss is scaled by it and the gradients
    unscaled by it; without, the loss is multiplied by `scale` and the
    gradients divided by it (a plain model at one global scale: the
    reference). `jit_compile=True` compiles the step with XLA.
    """

    @tf.function(jit_compile=jit_compile)
    def step():
        with tf.GradientTape() as tape:
            loss = loss_of(model)
            loss = optimizer.scale_loss(loss) if optimizer is not None else loss * scale
        grads = tape.gradient(loss, model.trainable_variables)
        if optimizer is not None:
            return optimizer.unscale(grads, model.trainable_variables)
        return [None if g is None else tf.convert_to_tensor(g) / scale for g in grads]

    return [None if g is None else np.asarray(tf.convert_to_tensor(g), "float32") for g in step()]


def assert_gradients_match(actual, expected, variables, relative, of_largest=0.0) -> float:
    """Asserts that each variable's gradient in `actual` is within `relative`
    of its largest gradient in `expected`, plus `of_largest` of the largest
    over all variables (for variables whose true gradient is zero, which hold
    only rounding noise), and None exactly where `expected` is; returns the
    worst error as a fraction of its bound."""
    largest = max(np.max(np.abs(e)) for e in expected if e is not None)
    worst = 0.0
    for a, e, v in zip(actual, expected, variables, strict=True):
        assert (a is None) == (e is None), v.path
        if e is not None:
            bound = relative * np.max(np.abs(e)) + of_largest * largest
            error = np.max(np.abs(a - e))
            assert error <= bound, (v.path, error, bound)
            worst = max(worst, error / bound if bound > 0 else 0.0)
    return worst


def assert_as_near_float32_as_plain(actual, plain, reference, variables, slack=0.1) -> float:
    """Asserts that each variable's float16 gradient in `actual` (keras_als's)
    is as near the float32 `reference` (the same weights and batch computed in
    float32) as the plain float16 model's gradient in `plain`, in the 2-norm:

        ||actual - reference|| <= (1 + slack) * ||plain - reference||
                                  + 2**-11 * ||reference|| + 2**-11 * largest

    `largest` is the largest 2-norm of a reference gradient (for variables
    whose true gradient is zero, which hold only rounding noise). A float16
    gradient is not a reference: how far float16 rounding moves a deep net's
    gradients from float32's depends on the CPU's kernels, and in a net with
    BatchNorm in training mode it can be tens of percent, so keras_als and the
    plain model may round apart by more than float16's precision. What does not
    depend on the CPU is that keras_als, whose scales are at least the plain
    model's, loses no more than it (`slack` for the rounding the two do not
    share). A gradient unscaled by a power of two too large fails it; where
    float16 itself lies far from float32 (60% on MobileNetV2's first
    convolution), one too small by 2 can pass, and only the float32
    exactness tests pin it. Returns the worst error as a fraction of its bound.
    """
    largest = max(np.linalg.norm(r) for r in reference if r is not None)
    unit = 2.0**-11
    worst = 0.0
    for a, p, r, v in zip(actual, plain, reference, variables, strict=True):
        assert (a is None) == (r is None) == (p is None), v.path
        if r is not None:
            norm = np.linalg.norm(r)
            bound = (1 + slack) * np.linalg.norm(p - r) + unit * norm + unit * largest
            error = np.linalg.norm(a - r)
            assert error <= bound, (v.path, error, bound, norm)
            worst = max(worst, error / bound)
    return worst
