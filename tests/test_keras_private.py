"""Every private Keras/TF API in keras_als/_keras_private.py still does what it is used for.

A Keras or TensorFlow upgrade that moves or changes one of them fails here, by
name and with the versions installed, rather than deep inside a training step.
And no other module of keras_als uses one (`test_no_module_but_keras_private_*`).
"""

import pathlib
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_als import _keras_private as private
from tests import private_access

PACKAGE = pathlib.Path(private.__file__).parent
REPOSITORY = PACKAGE.parent
VERSIONS = f"Keras {keras.__version__} with TensorFlow {tf.__version__}"


def _gone(dependency: str) -> str:
    return f"{dependency} is gone in {VERSIONS}; keras_als/_keras_private.py uses it."


def _changed(dependency: str) -> str:
    return (
        f"{dependency} changed in {VERSIONS}: it no longer does what "
        "keras_als/_keras_private.py uses it for."
    )


@pytest.fixture(scope="module")
def keras_names():
    return private_access.keras_names()


def test_no_module_but_keras_private_uses_a_private_keras_or_tensorflow_api(keras_names):
    """The one place rule, read off every module under keras_als/ (sub-packages
    too) with `ast`; tests/private_access.py says what counts as keras_als's own."""
    sources = {
        path.relative_to(REPOSITORY).as_posix(): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "_keras_private.py"
    }
    found = private_access.offenders(sources, keras_names)
    assert not found, (
        f"Private Keras/TensorFlow APIs used outside keras_als/_keras_private.py ({VERSIONS}). "
        "Move each access into a named function in keras_als/_keras_private.py (with a "
        "comment on why no public API does it) and call that instead:\n  " + "\n  ".join(found)
    )


def test_the_check_reports_a_planted_private_call(keras_names):
    planted = "def walk(layer):\n    return layer._flatten_layers()\n"
    assert private_access.offenders({"keras_als/planted.py": planted}, keras_names) == [
        "keras_als/planted.py:2: layer._flatten_layers"
    ]


PLANTED = textwrap.dedent(
    """\
    import keras
    import tensorflow as tf
    from keras.src.backend import AutocastScope
    from keras_als.step import _statistics

    _HOOK = "_keras_als_hook"


    class Wrapped(keras.layers.Wrapper):
        def __init__(self, layer):
            super().__init__(layer)
            self._owner = None
            self._convert_input_args = False

        def _declare(self, record):
            object.__setattr__(self.layer, _HOOK, None)
            return self._owner, self._declare, _statistics._vector(_statistics._LIMIT)

        def read(self, record):
            record._replace(entry=1), getattr(self.layer, _HOOK)
            getattr(self.layer, "_trainable_variables")
            return tf.__internal__.distribute, self._trainable_variables
    """
)


def test_the_check_tells_keras_als_s_own_names_from_keras_s(keras_names):
    """Its own: `self._owner` (assigned), `self._declare` (a method), the
    `_HOOK` attribute, a keras_als module's `_vector`, a namedtuple's `_replace`.
    Keras's: what a Keras base class carries, even on `self` and even assigned."""
    sources = {"keras_als/step/_statistics.py": "_LIMIT = 1\n", "keras_als/planted.py": PLANTED}

    def at(marker, code):
        """`code` reported on the one line of PLANTED that holds `marker`."""
        (number,) = [n for n, line in enumerate(PLANTED.splitlines(), 1) if marker in line]
        return f"keras_als/planted.py:{number}: {code}"

    assert private_access.offenders(sources, keras_names) == [
        at("keras.src", "import of keras.src.backend"),
        at("_convert_input_args", "self._convert_input_args"),
        at('"_trainable_variables"', "getattr(self.layer, '_trainable_variables')"),
        at("tf.__internal__", "self._trainable_variables"),
        at("tf.__internal__", "tf.__internal__"),
    ]


def test_every_function_of_keras_private_is_in_its_all():
    defined = {
        name
        for name, value in vars(private).items()
        if callable(value) and getattr(value, "__module__", None) == private.__name__
    }
    assert defined <= set(private.__all__)
    assert all(getattr(private, name, None) is not None for name in private.__all__)


def test_functional_is_the_class_of_graph_models_and_not_of_subclassed_ones():
    inputs = keras.Input((3,))
    functional = keras.Model(inputs, keras.layers.Dense(2)(inputs))

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    dependency = "keras.src.models.functional.Functional"
    assert isinstance(functional, private.Functional), _changed(dependency)
    assert not isinstance(Subclassed(), private.Functional), _changed(dependency)


def test_a_mask_set_on_a_tensor_is_read_back():
    x = tf.constant([[1.0, 2.0]])
    mask = tf.constant([[True, False]])
    assert private.get_keras_mask(x) is None, _changed("get_keras_mask")
    private.set_keras_mask(x, mask)
    read = private.get_keras_mask(x)
    assert read is not None, _changed("set_keras_mask / get_keras_mask")
    np.testing.assert_array_equal(read.numpy(), mask.numpy())


def test_producer_is_the_layer_whose_call_made_the_tensor():
    dense = keras.layers.Dense(2)
    tensor = dense(keras.Input((3,)))
    assert hasattr(tensor, "_keras_history"), _gone("KerasTensor._keras_history")
    assert private.producer(tensor) is dense, _changed("KerasTensor._keras_history.operation")


def test_converts_inputs_is_true_for_ordinary_layers():
    dense = keras.layers.Dense(2)
    assert hasattr(dense, "_convert_input_args"), _gone("Layer._convert_input_args")
    assert private.converts_inputs(dense) is True, _changed("Layer._convert_input_args")


def test_set_converts_inputs_false_leaves_a_layer_s_inputs_uncast():
    class Through(keras.layers.Layer):
        def call(self, x):
            return x

    layer, x = Through(dtype="float32"), tf.constant([1.0], tf.float64)
    assert layer(x).dtype == tf.float32, _changed("Layer.__call__'s cast of its inputs")
    private.set_converts_inputs(layer, False)
    assert not private.converts_inputs(layer)
    assert layer(x).dtype == tf.float64, _changed("Layer._convert_input_args (set to False)")


def test_has_own_output_spec_tells_layers_with_an_output_shape_from_those_traced():
    class Traced(keras.layers.Layer):
        def call(self, x):
            return x

    default = keras.layers.Layer.compute_output_shape
    assert getattr(default, "_is_default", False), _gone("Layer.compute_output_shape._is_default")
    assert private.has_own_output_spec(keras.layers.Conv2D(2, 1))  # compute_output_shape
    assert private.has_own_output_spec(keras.layers.Multiply())  # compute_output_spec
    assert not private.has_own_output_spec(Traced()), _changed("@utils.default / _is_default")


def test_no_automatic_dependency_tracking_keeps_an_attribute_out_of_tracking():
    class Holder(keras.layers.Layer):
        @private.no_automatic_dependency_tracking
        def keep(self, layers):
            self.kept = layers

    holder = Holder()
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    holder.keep([dense])
    dependency = "keras.src.utils.tracking.no_automatic_dependency_tracking"
    assert holder.weights == [], _changed(dependency)


def test_the_default_strategy_is_asked_without_error():
    distribute = getattr(getattr(tf, "__internal__", None), "distribute", None)
    dependency = "tf.__internal__.distribute.strategy_supports_no_merge_call"
    assert hasattr(distribute, "strategy_supports_no_merge_call"), _gone(dependency)
    assert isinstance(private.strategy_supports_no_merge_call(), bool), _changed(dependency)


def test_own_weights_are_a_layer_s_own_and_not_its_sublayers():
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)
    attention(np.ones((1, 3, 4)), np.ones((1, 3, 4)))
    for name in ("_trainable_variables", "_non_trainable_variables"):
        assert hasattr(attention, name), _gone(f"Layer.{name}")
    dependency = "Layer._trainable_variables / _non_trainable_variables"
    assert private.own_weights(attention) == [], _changed(dependency)
    query = attention._query_dense
    assert [w.name for w in private.own_weights(query)] == ["kernel", "bias"], _changed(dependency)
    norm = keras.layers.BatchNormalization()
    norm.build((None, 3))
    names = [w.name for w in private.own_weights(norm)]
    assert names == ["gamma", "beta", "moving_mean", "moving_variance"], _changed(dependency)


def _nested():
    """`outer` holds `inner` and `shared`; `inner` holds `shared` too."""
    shared = keras.layers.Dense(2, name="shared")
    inner = keras.Sequential([shared], name="inner")
    return keras.Sequential([inner, shared], name="outer")


def test_sublayers_are_the_layers_held_directly():
    inner = keras.Sequential([keras.layers.Dense(2, name="deep")], name="inner")
    outer = keras.Sequential([inner, keras.layers.Dense(1, name="top")])
    assert hasattr(outer, "_flatten_layers"), _gone("Layer._flatten_layers")
    names = [layer.name for layer in private.sublayers(outer)]
    assert names == ["inner", "top"], _changed("Layer._flatten_layers(recursive=False)")


def test_all_layers_are_every_layer_at_any_depth_each_once():
    outer = _nested()
    dependency = "Layer._flatten_layers(include_self=...)"
    assert hasattr(outer, "_flatten_layers"), _gone("Layer._flatten_layers")
    with_self = [layer.name for layer in private.all_layers(outer, include_self=True)]
    assert with_self == ["outer", "inner", "shared"], _changed(dependency)
    without = [layer.name for layer in private.all_layers(outer, include_self=False)]
    assert without == ["inner", "shared"], _changed(dependency)


def _built_optimizer(variables):
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    optimizer.build(variables)
    return optimizer


def test_trainable_variables_of_an_optimizer_are_those_it_was_built_for_in_order():
    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    # keras_als's optimizer builds through `keras.optimizers.Optimizer.build`, as
    # SGD does; a plain LossScaleOptimizer of Keras 3.10 does not call it.
    optimizer = keras.optimizers.SGD()
    optimizer.build(dense.trainable_variables)
    assert hasattr(optimizer, "_trainable_variables"), _gone("Optimizer._trainable_variables")
    found = private.trainable_variables_of(optimizer)
    assert len(found) == 2, _changed("Optimizer._trainable_variables")
    assert all(a is b for a, b in zip(found, dense.trainable_variables)), _changed(
        "Optimizer._trainable_variables"
    )


def test_overwrites_with_gradient_is_true_only_for_variables_marked_so():
    plain, overwritten = keras.Variable(1.0), keras.Variable(2.0)
    overwritten.overwrite_with_gradient = True
    optimizer = _built_optimizer([plain, overwritten])
    dependency = "Optimizer._overwrite_variable_with_gradient"
    assert hasattr(optimizer, "_overwrite_variable_with_gradient"), _gone(dependency)
    assert not private.overwrites_with_gradient(optimizer, plain), _changed(dependency)
    assert private.overwrites_with_gradient(optimizer, overwritten), _changed(dependency)


def test_no_autocast_reads_a_variable_as_itself_inside_a_float16_call():
    seen = {}

    class Reads(keras.layers.Layer):
        def build(self, shape):
            self.v = self.add_weight(shape=(), initializer="ones")

        def call(self, x):
            seen["autocast"] = self.v.value.dtype.name
            with private.no_autocast():
                seen["own"] = self.v.value.dtype.name
            return x

    Reads(dtype="mixed_float16")(np.ones((1, 2), "float32"))
    assert seen["autocast"] == "float16", _changed("Keras's autocast of variables in a call")
    assert seen["own"] == "float32", _changed("keras.src.backend.AutocastScope(None)")


def test_entry_layer_is_the_outermost_layer_being_called_and_none_outside_a_call():
    seen = []

    class Sees(keras.layers.Layer):
        def call(self, x):
            seen.append(private.entry_layer())
            return x

    inner = keras.Sequential([Sees()], name="inner")
    outer = keras.Sequential([keras.Input((2,)), inner], name="outer")
    seen.clear()
    outer(np.ones((1, 2)))
    inner(np.ones((1, 2)))
    dependency = "the call context's entry_layer (global_state 'current_call_ctx')"
    assert seen == [outer, inner], _changed(dependency)
    assert private.entry_layer() is None, _changed(dependency)


def test_a_tracked_variable_is_one_of_the_optimizer_s_variables():
    optimizer = _built_optimizer([keras.Variable(1.0)])
    extra = keras.Variable(3.0, name="extra")
    assert all(v is not extra for v in optimizer.variables)
    private.track_optimizer_variable(optimizer, extra)
    dependency = "Optimizer._track_variable"
    assert any(v is extra for v in optimizer.variables), _changed(dependency)
