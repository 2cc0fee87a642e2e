"""`wrap_model` and `unwrap_model`: scale boundaries in the user's own model, in place.

`wrap_model(model)` installs a hook on every layer of `model`, at any depth
(the projections inside a KerasHub transformer block included): an instance
attribute `call` (and `quantized_call`, which Keras runs instead for a
quantized layer) that shadows the class's method and runs it between scale
boundaries. Nothing else about the model changes: its class, config,
variables and their paths, weight order, `summary()` and `.keras` file are
the user's, and its own methods (a KerasHub task's `generate`,
`compute_loss`, `predict` decoding) keep working. At each traced call the
hook decides what the layer needs:

- a layer that owns trainable weights gets a boundary at each floating-point
  input, so its weights get a scale of their own;
- a layer without any weights that joins two or more floating-point tensors
  (`Add`, `Concatenate`) gets one at each input, so the branches meeting
  there keep scales of their own;
- any other call runs as it is.

Outside a traced function (eager or symbolic calls) the hooks only call the
layer.
"""

from __future__ import annotations

import functools
import threading

import keras
import tensorflow as tf

from keras_als._keras_private import Functional, own_weights, producer, sublayers
from keras_als.step import _layer_call
from keras_als.wrapper import AdaptiveScaled

_HOOK = "_keras_als_hook"
"""Attribute holding a layer's `Hook` (set past Keras's attribute tracking)."""
_METHODS = ("call", "quantized_call")
"""The methods Keras's `Operation.__call__` runs a layer's computation through."""


class Hook:
    """The boundaries' owner for one instrumented layer (see `_layer_call`).

    Attributes:
        scale_outputs: Also place a boundary at the layer's floating-point outputs.
    """

    def __init__(self, layer: keras.layers.Layer, scale_outputs: bool):
        self.layer = layer
        self.scale_outputs = scale_outputs
        # Set while a hooked method runs, per thread (tf.distribute traces each
        # replica in a thread of its own): a hooked method calling another of
        # the layer's places no second boundary.
        self._running = threading.local()

    @property
    def scale_path(self) -> str:
        return self.layer.path or self.layer.name

    @property
    def trainable_weights(self) -> list:
        if not self.layer.trainable:
            return []
        return [v for v in own_weights(self.layer) if v.trainable]

    @property
    def state_variables(self) -> list:
        trainable = {id(v) for v in self.trainable_weights}
        return [v for v in own_weights(self.layer) if id(v) not in trainable]

    def run(self, method, *args, **kwargs):
        """Runs the layer's `method` between the boundaries this call needs."""
        if getattr(self._running, "now", False) or not tf.inside_function():
            return method(*args, **kwargs)
        self._running.now = True
        try:
            scaled = bool(self.trainable_weights) or self.scale_outputs
            if not scaled and not self.layer.weights and _joins(args, kwargs):
                args, kwargs = _layer_call.cross_inputs(self, args, kwargs)
            if not scaled:
                return method(*args, **kwargs)
            return _layer_call.call_scaled(
                self, method, args, kwargs, scale_outputs=self.scale_outputs
            )
        finally:
            self._running.now = False


def hook_of(layer) -> Hook | None:
    """The `Hook` `wrap_model` installed on `layer`, or None."""
    return vars(layer).get(_HOOK)


def wrap_model(model: keras.Model, scale_each_output: bool = False) -> keras.Model:
    """Places scale boundaries in `model`, in place, and returns `model` itself.

    Every layer that owns trainable weights, at any depth (the query, key,
    value, output and feed-forward projections inside a KerasHub transformer
    block each on their own), gets a scale boundary at its inputs, and so
    gets a loss scale of its own from `keras_als.AdaptiveLossScaleOptimizer`;
    so does every input of a layer without weights that joins two or more
    floating-point tensors (`Add`, `Concatenate`). Joins written as
    operations (`x + y`) share one scale.

    Nothing else changes: the model keeps its class, attributes and methods (a
    KerasHub task's `generate`, `compute_loss` and `predict` decoding), its
    config, the paths and order of its weights, `summary()`, and what it
    saves to a `.keras` file (no keras_als class is in it: after loading,
    wrap the model again). The boundaries are identities forward, so outputs
    are unchanged. It works on Sequential, Functional and subclassed models,
    built or not, and composes with `enable_lora` and `quantize` in either
    order. Wrapping twice is harmless; `unwrap_model` undoes it. A layer
    shared with another model is instrumented in both. Layers inside a
    `keras_als.AdaptiveScaled` are left to it.

    Args:
        model: The `keras.Model` to instrument.
        scale_each_output: Give each output's loss its own scale: a boundary
            at the outputs of every layer that produces a model output too
            (graph models only; those outputs are then float32). Useful when
            one loss's gradients are far larger than another's (a detector's
            class and box losses).

    Returns:
        `model`, instrumented.

    Raises:
        TypeError: If `model` is not a `keras.Model`.

    Example:

    >>> import keras, keras_als
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="head")])
    >>> keras_als.wrap_model(model) is model
    True
    >>> type(model.get_layer("head")).__name__
    'Dense'
    """
    if not isinstance(model, keras.Model):
        what = "a layer" if isinstance(model, keras.layers.Layer) else type(model).__name__
        raise TypeError(
            f"wrap_model instruments a keras.Model, got {what} ({type(model).__name__}). "
            "Wrap the model that holds the layer, or the layer itself as "
            "keras_als.AdaptiveScaled(layer)."
        )
    outputs = _output_layers(model) if scale_each_output else set()
    for layer in _layers(model):
        hook = hook_of(layer)
        if hook is None:
            _install(layer, Hook(layer, id(layer) in outputs))
        elif id(layer) in outputs:
            hook.scale_outputs = True
        if hook_of(layer).trainable_weights:
            _layer_call.declare(hook_of(layer))
    retrace(model)
    return model


def unwrap_model(model: keras.Model) -> keras.Model:
    """Removes what `wrap_model` placed in `model`, in place, and returns `model`.

    Example:

    >>> import keras, keras_als
    >>> model = keras_als.wrap_model(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))
    >>> from keras_als.instrument import hook_of
    >>> hook_of(keras_als.unwrap_model(model).layers[0]) is None
    True
    """
    for layer in _layers(model):
        hook = hook_of(layer)
        if hook is not None:
            _layer_call.forget(hook)
            for name in (*_METHODS, _HOOK):
                vars(layer).pop(name, None)
    retrace(model)
    return model


def retrace(model) -> None:
    """Drops the functions `fit`, `evaluate`, `predict` (and a KerasHub task's
    `generate`) traced already, so the next call traces the model with (or
    without) its boundaries."""
    for name in ("train_function", "test_function", "predict_function", "generate_function"):
        if getattr(model, name, None) is not None:
            setattr(model, name, None)


def _install(layer, hook: Hook) -> None:
    """Shadows `layer`'s computing methods with ones that run through `hook`."""
    for name in _METHODS:
        method = getattr(layer, name, None)
        if method is not None:
            # Past Keras's __setattr__: a function is no state to track.
            object.__setattr__(layer, name, functools.partial(hook.run, method))
    object.__setattr__(layer, _HOOK, hook)


def _layers(model: keras.Model) -> list:
    """Every layer inside `model` that `wrap_model` instruments, each once.

    Graph models (their own graph calls their layers) and input layers are
    walked, not instrumented; nor is anything inside an `AdaptiveScaled`.
    """
    found, seen, pending = [], {id(model)}, list(sublayers(model))
    if not isinstance(model, (Functional, keras.Sequential)):
        found.append(model)  # a subclassed model may own weights itself
    while pending:
        layer = pending.pop(0)
        if id(layer) in seen or isinstance(layer, AdaptiveScaled):
            continue
        seen.add(id(layer))
        if not isinstance(layer, (Functional, keras.Sequential, keras.layers.InputLayer)):
            found.append(layer)
        pending.extend(sublayers(layer))
    return found


def _joins(args, kwargs) -> bool:
    """Whether a call's arguments hold two or more floating-point tensors."""
    return len(_layer_call.floating_positions(keras.tree.flatten((args, kwargs)))) >= 2


def _output_layers(model: keras.Model) -> set[int]:
    """`id`s of the layers whose calls produce `model`'s outputs (graph models)."""
    if not isinstance(model, Functional):
        return set()
    return {id(producer(t)) for t in keras.tree.flatten(model.outputs)}
