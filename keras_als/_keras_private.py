"""Every private Keras and TensorFlow API keras_als uses, in one place.

Each name below is used because no public API does the same; each was checked
against Keras 3.10 and 3.15 and TensorFlow 2.19 and 2.21 (the ends of
pyproject.toml's range). A Keras or TensorFlow upgrade that moves one of them
breaks here, at import, and in `tests/test_keras_private.py`, rather than deep
inside a training step.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras.src.backend import AutocastScope
from keras.src.backend.common import global_state
from keras.src.backend.common.masking import get_keras_mask, set_keras_mask
from keras.src.models.functional import Functional
from keras.src.utils.tracking import no_automatic_dependency_tracking

__all__ = [
    "Functional",
    "all_layers",
    "converts_inputs",
    "entry_layer",
    "has_own_output_spec",
    "get_keras_mask",
    "no_autocast",
    "no_automatic_dependency_tracking",
    "overwrites_with_gradient",
    "own_weights",
    "producer",
    "set_converts_inputs",
    "set_keras_mask",
    "strategy_supports_no_merge_call",
    "track_optimizer_variable",
    "sublayers",
    "trainable_variables_of",
]

# Functional: the class of every graph model built from inputs and outputs,
# including subclasses that call `super().__init__(inputs, outputs)` (every
# KerasHub backbone and task). Keras exports no public class to test for it.
#
# get_keras_mask / set_keras_mask: the mask a tensor carries between layers.
# AdaptiveScaled passes inputs through a boundary (a new tensor) and must carry
# the mask over, since the wrapped layer reads it off its inputs.
#
# no_automatic_dependency_tracking: keeps the optimizer's list of wrapped
# layers out of Keras's variable tracking (they are layers, not optimizer state).


def producer(tensor):
    """The layer (or operation) whose call produced symbolic `tensor`.

    `wrap_model(scale_each_output=True)` finds a model's output layers by it.
    It reads the tensor's private `_keras_history`, which has no public accessor.
    """
    return tensor._keras_history.operation


def converts_inputs(layer) -> bool:
    """Whether `layer.__call__` casts floating inputs to `layer.input_dtype`.

    AdaptiveScaled casts them itself, before its boundary, exactly when the
    layer would; Keras keeps the switch in the private `_convert_input_args`.
    """
    return bool(getattr(layer, "_convert_input_args", True))


# No public API: Keras reads `_convert_input_args` in `Layer.__call__` and offers no setter.
def set_converts_inputs(layer, value: bool) -> None:
    """Sets whether `layer.__call__` casts floating inputs to `layer.input_dtype`.

    `AdaptiveScaled` turns it off for itself: the layer it wraps casts its own
    inputs, so a cast in the wrapper too would be redundant.
    """
    layer._convert_input_args = value


def has_own_output_spec(layer) -> bool:
    """Whether `layer` computes its output spec itself rather than by tracing `call`.

    True where its class overrides `compute_output_spec` or
    `compute_output_shape`. Keras marks its default `compute_output_shape`
    with `@utils.default`, read by the private `_is_default`, and decides the
    same way in `Layer.compute_output_spec`.
    """
    spec = type(layer).compute_output_spec is not keras.layers.Layer.compute_output_spec
    shape = not getattr(type(layer).compute_output_shape, "_is_default", False)
    return spec or shape


def strategy_supports_no_merge_call() -> bool:
    """Whether the current tf.distribute strategy all-reduces without `merge_call`.

    Decides whether the optimizer may apply a step inside a `cond` in replica
    context; TensorFlow exposes it under `tf.__internal__` only.
    """
    return tf.__internal__.distribute.strategy_supports_no_merge_call()


def own_weights(layer) -> list:
    """The weights `layer` made itself, without those of its sublayers.

    `wrap_model` gives each layer that owns trainable weights its own scale,
    at any depth: a KerasHub transformer block owns none, its query, key,
    value and feed-forward projections own theirs. Keras lists a layer's own
    variables in the private `_trainable_variables` and
    `_non_trainable_variables` (its public `weights` adds the sublayers').
    """
    own, seen = [], set()
    for v in list(layer._trainable_variables) + list(layer._non_trainable_variables):
        if id(v) not in seen:
            seen.add(id(v))
            own.append(v)
    return own


def sublayers(layer) -> list:
    """The layers `layer` holds directly (as attributes or in lists), not theirs.

    Keras walks them with the private `_flatten_layers`; `wrap_model` walks
    them one level at a time, to leave alone what an `AdaptiveScaled` holds.
    """
    return layer._flatten_layers(include_self=False, recursive=False)


# No public API: `Model.layers` lists only the top level, and `Layer` has no such list at all.
def all_layers(layer, *, include_self: bool) -> list:
    """Every layer inside `layer`, at any depth, each once (`layer` first if `include_self`).

    `diagnose` and `calibrate` hook, find and re-type layers at any depth with
    it, through Keras's private `_flatten_layers`.

    Example:

    >>> import keras
    >>> inner = keras.Sequential([keras.layers.Dense(2, name="deep")], name="inner")
    >>> outer = keras.Sequential([inner], name="outer")
    >>> [layer.name for layer in all_layers(outer, include_self=True)]
    ['outer', 'inner', 'deep']
    """
    return layer._flatten_layers(include_self=include_self)


# No public API: a Keras optimizer lists the variables it was built for only privately.
def trainable_variables_of(optimizer) -> list:
    """The variables `optimizer` was built for, in the order `build` was given them.

    The optimizer applies to them when `apply` is given no variables, as
    Keras's `apply` does (its `_state.ScaleState` keeps the same list, the
    variables its columns are for).
    """
    return optimizer._trainable_variables


# No public API: the optimizer's rule for it is private (the variable's flag is what it reads).
def overwrites_with_gradient(optimizer, variable) -> bool:
    """Whether `optimizer` sets `variable` to its gradient instead of applying a step.

    Keras does so for float8 scales and histories (`overwrite_with_gradient`);
    such a gradient is no gradient of the loss, so it is neither scaled nor
    measured. Asked of the optimizer, as Keras's own `apply` does.
    """
    return optimizer._overwrite_variable_with_gradient(variable)


def no_autocast() -> AutocastScope:
    """A scope in which a variable reads as itself, not cast to the compute dtype.

    Inside a layer's call under mixed precision, Keras casts a float32
    variable read to float16 (`AutocastScope`, which has no public name);
    `_forward_state` needs the variable's own value and handle there.
    """
    return AutocastScope(None)


# No public API: Keras keeps the call in progress in a private global (`CallContext`).
def entry_layer():
    """The outermost layer whose call is in progress (the model `fit` called), or None.

    A scale boundary records it when the forward pass places it, so that
    `scale_loss` knows the model whose variables `apply` will most likely be
    given (`_early_build`). Keras sets it in `Layer.__call__` as
    `CallContext.entry_layer`, for the `training` argument of inner layers.
    """
    context = global_state.get_global_attribute("current_call_ctx")
    return None if context is None else context.entry_layer


# No public API: `add_variable` makes and tracks a variable in one call.
def track_optimizer_variable(optimizer, variable) -> None:
    """Makes `variable` one of `optimizer.variables`, as its `add_variable` does.

    `_early_build` makes the scale variables before it knows whether the
    optimizer will be built for the variables it guessed, and adopts them
    only then; Keras's `add_variable` ends by calling the private `_track_variable`.
    """
    optimizer._track_variable(variable)
