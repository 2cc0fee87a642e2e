"""`AdaptiveScaled`, the per-layer scale boundary, and `wrap_model`."""

from __future__ import annotations

import warnings
import weakref

import keras
import tensorflow as tf

from keras_als import _boundary, _forward_state
from keras_als._keras_private import (
    Functional,
    converts_inputs,
    get_keras_mask,
    has_own_output_spec,
    input_name,
    producer,
    set_keras_mask,
    untrack_layer,
)

_OWNER = "_keras_als_owner"
"""Attribute by which a wrapper declares, on each weight of its layer, that it owns it."""


def owner_of(variable) -> AdaptiveScaled | None:
    """The `AdaptiveScaled` wrapper whose layer holds `variable`, or None.

    A wrapper declares its layer's trainable weights once they exist (when it
    is built, computes its output spec or is called); the optimizer reads the
    declaration to give each wrapped layer a scale.

    Example:

    >>> import keras, keras_als
    >>> from keras_als.wrapper import owner_of
    >>> wrapped = keras_als.AdaptiveScaled(keras.layers.Dense(2))
    >>> _ = wrapped(keras.ops.ones((1, 3)))
    >>> owner_of(wrapped.layer.kernel) is wrapped
    True
    """
    reference = getattr(variable, _OWNER, None)
    return reference() if reference is not None else None


@keras.saving.register_keras_serializable(package="keras_als")
class AdaptiveScaled(keras.layers.Wrapper):
    """Gives a layer its own loss scale.

    Forward, the wrapped layer runs unchanged. Backward, the gradient leaving
    the layer towards its inputs crosses a scale boundary (a
    `tf.custom_gradient` identity) that converts it from the scale of the
    layer's component to the scale of the component upstream; the layer's
    weight gradients are computed at its own scale and unscaled by
    `keras_als.AdaptiveLossScaleOptimizer`. The wrapper adds no weights: its
    scale is optimizer state, and `model.summary()` counts the same parameters.

    Any layer works (Dense, Conv, BatchNormalization, LayerNormalization,
    Embedding, MultiHeadAttention, ...); integer inputs (token ids) get no
    boundary. When the optimizer skips a step, the forward-pass update of the
    layer's non-trainable state (the moving statistics of BatchNormalization)
    is undone too, so a skipped batch leaves no trace.

    With `scale_outputs=True` the gradient arriving at the layer's outputs
    crosses a boundary too: the layer's weights then get a scale of their own,
    apart from what lies downstream. On a model's output layer this gives each
    output's loss its own scale (see `wrap_model(scale_each_output=True)`).
    The outputs are then returned in float32 (as Keras advises for a model's
    outputs under mixed precision), so that the gradient from the loss reaches
    the boundary before it is rounded to float16.

    Args:
        layer: The layer to wrap.
        scale_outputs: Also place a boundary on the layer's floating-point outputs.
        **kwargs: Layer arguments such as `name` (default: `"<layer>_scaled"`).

    Example:

    >>> import keras, keras_als
    >>> dense = keras_als.AdaptiveScaled(keras.layers.Dense(3, name="hidden"))
    >>> dense(keras.ops.ones((2, 4))).shape
    TensorShape([2, 3])
    >>> dense.name, dense.layer.name
    ('hidden_scaled', 'hidden')
    """

    def __init__(self, layer: keras.layers.Layer, scale_outputs: bool = False, **kwargs):
        if isinstance(layer, AdaptiveScaled):
            raise ValueError(f"Layer {layer.name!r} is already wrapped in AdaptiveScaled.")
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(
                f"AdaptiveScaled wraps a keras.layers.Layer, got {type(layer).__name__}."
            )
        kwargs.setdefault("name", f"{layer.name}_scaled")
        kwargs.setdefault("dtype", layer.dtype_policy)
        super().__init__(layer, **kwargs)
        self.scale_outputs = bool(scale_outputs)
        self.supports_masking = layer.supports_masking
        # The wrapped layer casts its own inputs; casting here too would be redundant.
        self._convert_input_args = False

    def build(self, *args, **kwargs):
        # The wrapped layer builds itself on its first call, with its own signature.
        self.built = True
        self._declare_weights()

    def _declare_weights(self):
        """Declares the wrapped layer's trainable weights as this wrapper's (see
        `owner_of`), once they exist: on every build, output spec and call."""
        for variable in self.layer.trainable_weights:
            setattr(variable, _OWNER, weakref.ref(self))

    def call(self, *args, **kwargs):
        flat = keras.tree.flatten((args, kwargs))
        floating = _floating_positions(flat)
        if floating:
            # Cast as the layer would, before the boundary: the gradient of that
            # cast then rounds to float16 at the upstream scale, not at the layer's.
            # One boundary per input: inputs from different regions (the two
            # branches of an Add) keep their own scales upstream.
            crossed = [
                _boundary.insert(self, [self._as_layer_input(flat[i])], upstream=[flat[i]])[0]
                for i in floating
            ]
            _replace_keeping_masks(flat, floating, crossed)  # the layer reads masks off its inputs
            args, kwargs = keras.tree.pack_sequence_as((args, kwargs), flat)
        _forward_state.snapshot(self.layer.non_trainable_variables)
        outputs = self.layer(*args, **kwargs)
        self._declare_weights()
        if self.scale_outputs:
            outputs = self._cross_outputs(outputs)
        return outputs

    def _cross_outputs(self, outputs):
        """`outputs` through one boundary, in float32 (masks kept).

        The boundary sits on the float32 side: a float16 gradient arriving
        from the loss would already have rounded (and underflowed) at the
        loss's scale before the boundary could change it.
        """
        flat = keras.tree.flatten(outputs)
        floating = _floating_positions(flat)
        wide = [tf.cast(flat[i], tf.float32) for i in floating]
        crossed = _boundary.insert(self, wide, upstream=[flat[i] for i in floating])
        _replace_keeping_masks(flat, floating, crossed)
        return keras.tree.pack_sequence_as(outputs, flat)

    def compute_output_spec(self, *args, **kwargs):
        # The boundaries are identities: the output spec is the layer's own,
        # where it has one. Keras's default traces `call` on placeholders, and
        # a sparse one where Keras marks a symbolic tensor sparse (as keras.ops
        # arithmetic with a Python number does), which a layer that is never
        # traced there in the plain model may not take. The layer's weights are
        # made in its first call, so an unbuilt layer is traced once on dense
        # placeholders, to build it.
        if not has_own_output_spec(self.layer):
            return super().compute_output_spec(*args, **kwargs)
        if not self.layer.built:
            dense_args, dense_kwargs = keras.tree.map_structure(_dense_spec, (args, kwargs))
            super().compute_output_spec(*dense_args, **dense_kwargs)
        self._declare_weights()
        spec = self.layer.compute_output_spec(*args, **kwargs)
        if not self.scale_outputs:
            return spec
        return keras.tree.map_structure(_as_float32_spec, spec)

    def get_config(self):
        return {**super().get_config(), "scale_outputs": self.scale_outputs}

    def _as_layer_input(self, x):
        """`x` cast to the wrapped layer's input dtype, as its `__call__` would."""
        layer = self.layer
        if not converts_inputs(layer):
            return x
        return layer.dtype_policy.convert_input(x, layer.autocast, layer.input_dtype)

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return super().from_config(dict(config), custom_objects=custom_objects)

    def compute_mask(self, inputs, mask=None):
        # `call(*args)` hands Keras its positional arguments as a tuple: a layer
        # called on one list (Concatenate, Add) expects the list itself.
        if isinstance(inputs, tuple) and len(inputs) == 1:
            inputs = inputs[0]
            mask = mask[0] if isinstance(mask, tuple) and len(mask) == 1 else mask
        return self.layer.compute_mask(inputs, mask)


def _dense_spec(spec):
    """`spec` (a symbolic tensor or anything else), not sparse."""
    if not isinstance(spec, keras.KerasTensor) or not spec.sparse:
        return spec
    return keras.KerasTensor(spec.shape, dtype=spec.dtype, name=spec.name)


def _as_float32_spec(spec):
    """A floating symbolic output as `_cross_outputs` returns it: in float32."""
    if not isinstance(spec, keras.KerasTensor) or "float" not in str(spec.dtype):
        return spec
    return keras.KerasTensor(spec.shape, dtype="float32", sparse=spec.sparse, name=spec.name)


def _floating_positions(flat: list) -> list[int]:
    """Positions of the floating-point tensors in `flat`."""
    return [i for i, x in enumerate(flat) if isinstance(x, tf.Tensor) and x.dtype.is_floating]


def _replace_keeping_masks(flat: list, positions: list[int], replacements: list) -> None:
    """Puts `replacements` at `positions` of `flat`, each with the mask of what it replaces."""
    for i, x in zip(positions, replacements):
        mask = get_keras_mask(flat[i])
        if mask is not None:
            set_keras_mask(x, mask)
        flat[i] = x


def wrap_model(model: keras.Model, scale_each_output: bool = False) -> keras.Model:
    """Returns a copy of `model` with its layers wrapped in `AdaptiveScaled`.

    Every layer with trainable weights is wrapped, and so is every layer that
    joins two or more floating-point tensors without weights of its own (`Add`,
    `Concatenate`, ...): a boundary at each input of a join gives the branches
    that meet there scales of their own, so the blocks of a residual trunk keep
    one scale each instead of sharing one along the trunk. Other layers stay
    as they are. Nested graph models (Sequential, Functional, and subclasses
    of Functional such as KerasHub backbones) are wrapped layer by layer at any
    depth. The copy has the same weights (values copied, not shared),
    computes the same outputs, and saves and loads as a `.keras` file. Each
    wrapper takes the name of the layer it wraps, so `get_layer`, the output
    names (the keys of a loss or metric dict, of `history`) and the names in
    `model.summary()` are the original model's.

    A subclass of a functional model (a KerasHub backbone or task) is copied
    as a plain `keras.Model` with the same graph: its own methods (a task's
    `generate`) are not carried over, and its `weights` are in graph order,
    not the order the original tracked its layers in (KerasHub's ESM2 and
    XLNet): copy weights between the two with `get_layer(name)`, not
    `set_weights(model.get_weights())`. A layer used in two places of a
    nested graph (the token embedding a KerasHub causal or masked LM reuses)
    stays one layer, so tied weights stay tied; Keras 3.15 cannot load such a
    graph from a `.keras` file, wrapped or not: keep its weights with `save_weights`.

    Layers are copied from their configs, as `keras.models.clone_model` copies
    them. A layer whose config does not round-trip (a bug of that layer, such
    as KerasHub 0.32's Llama decoder layer) is not copied: the copy wraps the
    layer itself, shares its weights with `model`, and a warning names it.

    Args:
        model: A built Sequential or Functional `keras.Model`, or a subclass of
            Functional (one that calls `super().__init__(inputs, outputs)`).
        scale_each_output: Give each output's loss its own scale: a boundary
            at the outputs of every wrapped layer that produces a model output
            (`AdaptiveScaled(scale_outputs=True)`). Without it the output
            layers' weights share the loss's scale, which must then suit the
            loss with the largest gradients; with it each output layer's
            weights are scaled for their own loss. Useful when one loss's
            gradients are far larger than another's (a detector's class and box
            losses, a value head beside a classifier).

    Returns:
        A new model of the same structure, ready for
        `keras_als.AdaptiveLossScaleOptimizer`.

    Raises:
        ValueError: For a subclassed model (its graph is its `call` method, which
            cannot be copied layer by layer: wrap its layers by hand where it
            creates them) or a model that is not built.

    Example:

    >>> import keras, keras_als
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(4, name="hidden")(inputs)
    >>> outputs = keras.layers.Add(name="residual")([inputs, hidden])
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="head")(outputs))
    >>> [(layer.name, type(layer).__name__) for layer in keras_als.wrap_model(model).layers[1:]]
    [('hidden', 'AdaptiveScaled'), ('residual', 'AdaptiveScaled'), ('head', 'AdaptiveScaled')]
    """
    if not isinstance(model, keras.Model) or not _is_graph_model(model):
        raise ValueError(
            f"wrap_model copies graph models (Sequential, Functional, or a subclass built "
            f"with super().__init__(inputs, outputs)); {type(model).__name__} is a "
            "subclassed model whose graph is its call() method. Wrap its layers where you "
            "create them instead, e.g. "
            "`self.dense = keras_als.AdaptiveScaled(keras.layers.Dense(64))` in __init__."
        )
    if not model.built:
        raise ValueError(
            "wrap_model needs a built model: give it an Input (keras.Input(shape)) or "
            "call model.build(input_shape) first."
        )
    copies = _Copies()
    wrapped = _copy_wrapped(model, copies, _output_layers(model) if scale_each_output else set())
    _warn_not_copied(copies.not_copied)
    _copy_weights(model, wrapped, copies.pairs)
    return wrapped


class _Copies:
    """What `_copy_wrapped` made: each layer with weights and its copy (at any
    depth), the copy that stands for each layer (`made`, by the layer's `id`),
    and the layers it could not copy (names, with the error).

    `made` spans every depth: a layer called both inside a nested model and in
    the model around it (the token embedding a KerasHub causal LM calls again,
    reversed, on the backbone's output: its output weights are tied to the
    input's) gets one copy, called at both places, so the copy ties them too.
    """

    def __init__(self):
        self.pairs: list[tuple[keras.layers.Layer, keras.layers.Layer]] = []
        self.made: dict[int, keras.layers.Layer] = {}
        self.not_copied: dict[str, str] = {}


def _copy_weights(model: keras.Model, wrapped: keras.Model, pairs) -> None:
    """Assigns each layer's weight values to its copy's, layer by layer.

    Not `model.weights` to `wrapped.weights` in order: a subclass of
    Functional lists its weights in the order it tracked its layers as
    attributes (KerasHub's ESM2 and XLNet backbones), its copy in graph order.
    """
    assigned = set()
    for layer, copy in pairs:
        source, target = layer.weights, copy.weights
        if [tuple(w.shape) for w in source] != [tuple(w.shape) for w in target]:
            raise RuntimeError(  # a bug in wrap_model, not in the model: say so
                f"wrap_model could not match the weights of layer {layer.name!r} to its "
                f"copy's ({len(source)} in the layer, {len(target)} in the copy); "
                "please report it."
            )
        for w, v in zip(source, target):
            if v is not w:  # a layer that could not be copied is its own copy
                v.assign(w)
            assigned.add(id(v))
    missing = [v.path for v in wrapped.weights if id(v) not in assigned]
    if missing or len(wrapped.weights) != len(model.weights):
        raise RuntimeError(
            f"wrap_model could not match the weights of {model.name!r} one to one "
            f"({len(model.weights)} in the model, {len(wrapped.weights)} in the copy, "
            f"not assigned: {missing[:5]}); please report it."
        )


def _output_layers(model: keras.Model) -> set[int]:
    """`id`s of the layers of `model` (at its top level) whose outputs are model outputs."""
    return {id(producer(t)) for t in keras.tree.flatten(model.output)}


def _copy_wrapped(
    model: keras.Model, copies: _Copies, scale_outputs_of: set[int] = frozenset()
) -> keras.Model:
    """The copy of `model` with wrapped layers, weights not yet copied (each
    layer and its copy are recorded in `copies`); the layers whose `id` is in
    `scale_outputs_of` get a boundary at their outputs too."""

    def copy_layer(layer):
        if not isinstance(layer, keras.layers.Layer):  # an operation, e.g. keras.ops.add
            return layer
        if id(layer) not in copies.made:
            copies.made[id(layer)] = new_copy(layer)
        return copies.made[id(layer)]

    def new_copy(layer):
        if _is_graph_model(layer):
            return _copy_wrapped(layer, copies)
        clone = _copy_of(layer, copies.not_copied)
        if clone is not layer:
            clone = _tied_and_built(layer, clone, copies)
        if layer.weights:
            copies.pairs.append((layer, clone))
        if isinstance(layer, AdaptiveScaled) or not layer.trainable_weights:
            return clone
        return AdaptiveScaled(clone, scale_outputs=id(layer) in scale_outputs_of, name=layer.name)

    def call_layer(layer, *args, **kwargs):
        if _joins_branches(layer, args, kwargs):
            layer = AdaptiveScaled(layer, name=layer.name)
        return layer(*args, **kwargs)

    if isinstance(model, keras.Sequential):
        return keras.models.clone_model(model, clone_function=copy_layer)
    # Fresh inputs with the original names (clone_model would take generated ones).
    inputs = keras.tree.map_structure(
        lambda t: keras.Input(batch_shape=t.shape, dtype=t.dtype, name=input_name(t)),
        model.input,
    )
    return keras.models.clone_model(
        model, input_tensors=inputs, clone_function=copy_layer, call_function=call_layer
    )


def _copy_of(layer: keras.layers.Layer, not_copied: dict[str, str]) -> keras.layers.Layer:
    """A new layer from `layer`'s config, as `keras.models.clone_model` makes one;
    `layer` itself where its config does not round-trip (recorded in `not_copied`:
    its name and the error, for the warning)."""
    try:
        return layer.__class__.from_config(layer.get_config())
    except Exception as error:
        not_copied[layer.name] = f"{type(layer).__name__}: {type(error).__name__}: {error}"
        return layer


def _tie_held_layers(original, clone, made: dict) -> None:
    """Ties the layers `clone` holds as attributes to the copies made elsewhere.

    A layer may hold another layer of the model: KerasHub's masked LM head
    holds the backbone's token embedding, and its copy from config holds a
    new one. Where the held layer was copied already (`made`), the clone
    holds that copy instead; else `made` learns the clone's own, so that the
    graph calling the held layer elsewhere (KerasHub's OPT causal LM calls a
    layer of its backbone's embeddings layer) calls the clone's.
    """
    for name, held in vars(original).items():
        ours = getattr(clone, name, None)
        if not isinstance(held, keras.layers.Layer) or not isinstance(ours, type(held)):
            continue
        if id(held) in made:
            copy = made[id(held)]
            untrack_layer(clone, ours)
            setattr(clone, name, copy.layer if isinstance(copy, AdaptiveScaled) else copy)
        elif ours is not held:
            made[id(held)] = ours
            _tie_held_layers(held, ours, made)


def _tied_and_built(layer, clone, copies: _Copies):
    """`clone` with its held layers tied (`_tie_held_layers`) and, where `layer`
    gives its output spec itself, built from `layer`'s build config.

    The wrapper then needs no trace of `call` to build the copy, which a layer
    may not allow on symbolic shapes (KerasHub's Qwen 3.5 decoder branches in
    Python on its sequence length), as Keras's own call does not. Where that
    build fails or makes other weights than `layer` has (a layer that makes
    some in `call`, as KerasHub's DeBERTa relative embedding), a new copy,
    left to build on its first call, as Keras's own layers are.
    """
    _tie_held_layers(layer, clone, copies.made)
    config = layer.get_build_config() if layer.built else None
    keras_own = type(layer).__module__.startswith("keras.")
    if keras_own or not config or clone.built or not has_own_output_spec(layer):
        return clone
    try:
        clone.build_from_config(config)
        shapes = [tuple(w.shape) for w in clone.weights]
    except Exception:
        shapes = None
    if shapes == [tuple(w.shape) for w in layer.weights]:
        return clone
    fresh = _copy_of(layer, copies.not_copied)  # its config round-tripped just now
    if fresh is not layer:
        _tie_held_layers(layer, fresh, copies.made)
    return fresh


def _warn_not_copied(not_copied: dict[str, str]) -> None:
    if not not_copied:
        return
    names = ", ".join(repr(name) for name in not_copied)
    first = next(iter(not_copied.values()))
    warnings.warn(
        f"wrap_model could not copy {len(not_copied)} layer(s) from their configs "
        f"({names}; the first error: {first}). keras.models.clone_model fails on them "
        "the same way: a bug of those layers' get_config/from_config. The wrapped model "
        "uses these layers themselves: their weights are shared with the original "
        "model, not copied, and the wrapped model loads from a .keras file only once "
        "the layers are fixed.",
        stacklevel=3,
    )


def _joins_branches(layer, args, kwargs) -> bool:
    """True for a weightless layer called on two or more floating-point tensors."""
    if not isinstance(layer, keras.layers.Layer) or isinstance(layer, AdaptiveScaled):
        return False
    if layer.weights or _is_graph_model(layer):
        return False
    floating = [
        x
        for x in keras.tree.flatten((args, kwargs))
        if isinstance(x, keras.KerasTensor) and "float" in str(x.dtype)
    ]
    return len(floating) >= 2


def _is_graph_model(model) -> bool:
    return isinstance(model, (keras.Sequential, Functional))
