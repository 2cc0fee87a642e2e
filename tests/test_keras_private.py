"""Every private Keras/TF API in keras_als/_keras_private.py still does what it is used for.

A Keras or TensorFlow upgrade that moves or changes one of them fails here, by
name, rather than deep inside a training step.
"""

import pathlib
import re

import keras
import numpy as np
import tensorflow as tf

from keras_als import _keras_private as private


def test_no_other_module_of_keras_als_reaches_into_private_keras_or_tensorflow():
    """The one place rule: keras.src, tensorflow.python, tf.__internal__ and
    underscore attributes of Keras objects appear only in _keras_private.py."""
    package = pathlib.Path(private.__file__).parent
    pattern = re.compile(
        r"keras\.src|tensorflow\.python|__internal__|_keras_history|_inbound_nodes"
    )
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(package.glob("*.py"))
        if path.name != "_keras_private.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
    for name in private.__all__:
        assert getattr(private, name) is not None, name


def test_functional_is_the_class_of_graph_models_and_not_of_subclassed_ones():
    inputs = keras.Input((3,))
    functional = keras.Model(inputs, keras.layers.Dense(2)(inputs))

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    assert isinstance(functional, private.Functional)
    assert not isinstance(Subclassed(), private.Functional)


def test_a_mask_set_on_a_tensor_is_read_back():
    x = tf.constant([[1.0, 2.0]])
    mask = tf.constant([[True, False]])
    assert private.get_keras_mask(x) is None
    private.set_keras_mask(x, mask)
    np.testing.assert_array_equal(private.get_keras_mask(x).numpy(), mask.numpy())


def test_producer_is_the_layer_whose_call_made_the_tensor():
    dense = keras.layers.Dense(2)
    assert private.producer(dense(keras.Input((3,)))) is dense


def test_input_name_is_the_name_given_to_keras_input():
    assert private.input_name(keras.Input((3,), name="pixels")) == "pixels"


def test_converts_inputs_is_true_for_ordinary_layers():
    assert private.converts_inputs(keras.layers.Dense(2)) is True


def test_has_own_output_spec_tells_layers_with_an_output_shape_from_those_traced():
    class Traced(keras.layers.Layer):
        def call(self, x):
            return x

    assert private.has_own_output_spec(keras.layers.Conv2D(2, 1))  # compute_output_shape
    assert private.has_own_output_spec(keras.layers.Multiply())  # compute_output_spec
    assert not private.has_own_output_spec(Traced())


def test_no_automatic_dependency_tracking_keeps_an_attribute_out_of_tracking():
    class Holder(keras.layers.Layer):
        @private.no_automatic_dependency_tracking
        def keep(self, layers):
            self.kept = layers

    holder = Holder()
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    holder.keep([dense])
    assert holder.weights == []


def test_the_default_strategy_is_asked_without_error():
    assert isinstance(private.strategy_supports_no_merge_call(), bool)


def test_own_weights_are_a_layer_s_own_and_not_its_sublayers():
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)
    attention(np.ones((1, 3, 4)), np.ones((1, 3, 4)))
    assert private.own_weights(attention) == []
    query = attention._query_dense
    assert [w.name for w in private.own_weights(query)] == ["kernel", "bias"]


def test_sublayers_are_the_layers_held_directly():
    inner = keras.Sequential([keras.layers.Dense(2, name="deep")], name="inner")
    outer = keras.Sequential([inner, keras.layers.Dense(1, name="top")])
    assert [layer.name for layer in private.sublayers(outer)] == ["inner", "top"]
