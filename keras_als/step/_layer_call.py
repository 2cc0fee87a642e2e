"""One scaled call of a layer: boundaries around it, and who owns its weights.

`AdaptiveScaled` (a wrapper layer) and `wrap_model` (hooks installed on the
user's own layers) scale a layer the same way, here:

- `cross_inputs`: each floating-point input of the layer passes through a
  scale boundary of its own (inputs from different regions, the two
  branches of an `Add`, keep their own scales upstream), after the cast to
  the layer's compute dtype, so the gradient of that cast rounds to float16
  at the upstream scale, not at the layer's;
- `cross_outputs`: the layer's floating-point outputs through one boundary,
  in float32 (a model output's loss then gets a scale of its own);
- `declare`: the layer's trainable weights name the boundaries' owner (see
  `owner_of`), which the optimizer reads to name and place each scale.

An *owner* is the object a boundary belongs to: an `AdaptiveScaled`, or the
hook `wrap_model` installs on a layer. It has `layer` (the layer it scales),
`trainable_weights` (the weights that take its scale), `state_variables` (what
a forward call may update) and `scale_path` (the
name its scale is reported by, before `scale_names` shortens it).
"""

from __future__ import annotations

import weakref

import keras
import tensorflow as tf

from keras_als._keras_private import get_keras_mask, set_keras_mask
from keras_als.step import _boundary, _forward_state

_OWNER = "_keras_als_owner"
"""Attribute by which an owner declares, on each weight it scales, that it owns it."""


def owner_of(variable):
    """The owner (an `AdaptiveScaled`, or a layer's `wrap_model` hook) of `variable`, or None.

    Example:

    >>> import keras, keras_als
    >>> from keras_als.step._layer_call import owner_of
    >>> wrapped = keras_als.AdaptiveScaled(keras.layers.Dense(2))
    >>> _ = wrapped(keras.ops.ones((1, 3)))
    >>> owner_of(wrapped.layer.kernel) is wrapped
    True
    """
    reference = getattr(variable, _OWNER, None)
    return reference() if reference is not None else None


def declare(owner) -> None:
    """Marks `owner`'s trainable weights as its own (on every build and call:
    weights may appear late, as LoRA's do)."""
    for variable in owner.trainable_weights:
        setattr(variable, _OWNER, weakref.ref(owner))


def forget(owner) -> None:
    """Undoes `declare` for the weights `owner` still owns."""
    for variable in owner.layer.weights:
        if owner_of(variable) is owner:
            delattr(variable, _OWNER)


def floating_positions(flat: list) -> list[int]:
    """Positions of the floating-point graph tensors in `flat`."""
    return [i for i, x in enumerate(flat) if isinstance(x, tf.Tensor) and x.dtype.is_floating]


def cross_inputs(owner, args: tuple, kwargs: dict, cast=None) -> tuple[tuple, dict]:
    """`(args, kwargs)` with each floating-point tensor through a boundary of its own.

    Args:
        owner: The boundaries' owner.
        args: The call's positional arguments.
        kwargs: Its keyword arguments.
        cast: Casts a tensor to the layer's input dtype, as its `__call__`
            would; None where the layer's `__call__` has cast already (the
            tensor upstream of that cast then sets the boundary's dtype limit).
    """
    flat = keras.tree.flatten((args, kwargs))
    floating = floating_positions(flat)
    if not floating:
        return args, kwargs
    crossed = []
    for i in floating:
        x = flat[i]
        inside = cast(x) if cast is not None else x
        upstream = x if cast is not None else _before_cast(x)
        crossed.append(_boundary.insert(owner, [inside], upstream=[upstream])[0])
    _replace_keeping_masks(flat, floating, crossed)  # the layer reads masks off its inputs
    return keras.tree.pack_sequence_as((args, kwargs), flat)


def cross_outputs(owner, outputs):
    """`outputs` through one boundary, in float32 (masks kept).

    The boundary sits on the float32 side: a float16 gradient arriving from
    the loss would already have rounded (and underflowed) at the loss's
    scale before the boundary could change it.
    """
    flat = keras.tree.flatten(outputs)
    floating = floating_positions(flat)
    wide = [tf.cast(flat[i], tf.float32) for i in floating]
    crossed = _boundary.insert(owner, wide, upstream=[flat[i] for i in floating])
    _replace_keeping_masks(flat, floating, crossed)
    return keras.tree.pack_sequence_as(outputs, flat)


def call_scaled(owner, call, args: tuple, kwargs: dict, cast=None, scale_outputs=False):
    """Calls `call` on `args` and `kwargs` with `owner`'s boundaries around it.

    Snapshots the forward-pass state updates of `owner.layer` (restored if the
    optimizer skips the step) and declares `owner`'s weights.
    """
    args, kwargs = cross_inputs(owner, args, kwargs, cast)
    with _forward_state.watch(owner.state_variables):
        outputs = call(*args, **kwargs)
    declare(owner)
    return cross_outputs(owner, outputs) if scale_outputs else outputs


def _before_cast(x: tf.Tensor) -> tf.Tensor:
    """The floating-point tensor `x` was cast from (in the traced graph), else `x`."""
    op = getattr(x, "op", None)
    if op is not None and op.type == "Cast" and op.inputs[0].dtype.is_floating:
        return op.inputs[0]
    return x


def _replace_keeping_masks(flat: list, positions: list[int], replacements: list) -> None:
    """Puts `replacements` at `positions` of `flat`, each with the mask of what it replaces."""
    for i, x in zip(positions, replacements):
        mask = get_keras_mask(flat[i])
        if mask is not None:
            set_keras_mask(x, mask)
        flat[i] = x
