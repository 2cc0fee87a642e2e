"""`AdaptiveScaled`, the per-layer scale boundary, and `wrap_model`."""

from __future__ import annotations

import keras
import tensorflow as tf
from keras.src.backend.common.masking import get_keras_mask, set_keras_mask

from keras_als import _boundary, _forward_state
from keras_als.optimizer import mark_owner


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

    Args:
        layer: The layer to wrap.
        **kwargs: Layer arguments such as `name` (default: `"<layer>_scaled"`).

    Example:

    >>> import keras, keras_als
    >>> dense = keras_als.AdaptiveScaled(keras.layers.Dense(3, name="hidden"))
    >>> dense(keras.ops.ones((2, 4))).shape
    TensorShape([2, 3])
    >>> dense.name, dense.layer.name
    ('hidden_scaled', 'hidden')
    """

    def __init__(self, layer: keras.layers.Layer, **kwargs):
        if isinstance(layer, AdaptiveScaled):
            raise ValueError(f"Layer {layer.name!r} is already wrapped in AdaptiveScaled.")
        if not isinstance(layer, keras.layers.Layer):
            raise TypeError(
                f"AdaptiveScaled wraps a keras.layers.Layer, got {type(layer).__name__}."
            )
        kwargs.setdefault("name", f"{layer.name}_scaled")
        kwargs.setdefault("dtype", layer.dtype_policy)
        super().__init__(layer, **kwargs)
        self.supports_masking = layer.supports_masking
        # The wrapped layer casts its own inputs; casting here too would be redundant.
        self._convert_input_args = False

    def build(self, *args, **kwargs):
        # The wrapped layer builds itself on its first call, with its own signature.
        self.built = True

    def call(self, *args, **kwargs):
        flat = keras.tree.flatten((args, kwargs))
        floating = [
            i for i, x in enumerate(flat) if isinstance(x, tf.Tensor) and x.dtype.is_floating
        ]
        if floating:
            crossed = _boundary.insert(self, [flat[i] for i in floating])
            for i, x in zip(floating, crossed):
                mask = get_keras_mask(flat[i])
                if mask is not None:
                    set_keras_mask(x, mask)  # the layer reads masks off its inputs
                flat[i] = x
            args, kwargs = keras.tree.pack_sequence_as((args, kwargs), flat)
        state = _forward_state.snapshot(self.layer.non_trainable_variables)
        outputs = self.layer(*args, **kwargs)
        _forward_state.record(state)
        mark_owner(self, self.layer.trainable_weights)
        return outputs

    @classmethod
    def from_config(cls, config, custom_objects=None):
        return super().from_config(dict(config), custom_objects=custom_objects)

    def compute_mask(self, inputs, mask=None):
        return self.layer.compute_mask(inputs, mask)


def wrap_model(model: keras.Model) -> keras.Model:
    """Returns a copy of `model` with every layer that has trainable weights wrapped.

    The copy has the same weights (values copied, not shared) and the same
    structure; layers without trainable weights stay as they are, and nested
    Sequential or Functional models are wrapped inside. Call it on a built model.

    Args:
        model: A Sequential or Functional `keras.Model`.

    Returns:
        A new model of the same kind, ready for
        `keras_als.AdaptiveLossScaleOptimizer`.

    Raises:
        ValueError: For a subclassed model, which cannot be copied layer by
            layer: wrap its layers by hand where it creates them.

    Example:

    >>> import keras, keras_als
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="head")])
    >>> [layer.name for layer in keras_als.wrap_model(model).layers]
    ['head_scaled']
    """
    if not isinstance(model, (keras.Sequential, keras.Model)) or not _is_graph_model(model):
        raise ValueError(
            f"wrap_model copies Sequential and Functional models; {type(model).__name__} "
            "is a subclassed model. Wrap its layers where you create them instead, e.g. "
            "`self.dense = keras_als.AdaptiveScaled(keras.layers.Dense(64))` in __init__."
        )
    if not model.built:
        raise ValueError(
            "wrap_model needs a built model: give it an Input (keras.Input(shape)) or "
            "call model.build(input_shape) first."
        )

    def wrap(layer):
        if not isinstance(layer, keras.layers.Layer):  # an operation, e.g. a mask's NotEqual
            return layer
        if isinstance(layer, keras.Model) and _is_graph_model(layer):
            return wrap_model(layer)
        clone = layer.__class__.from_config(layer.get_config())
        if isinstance(layer, AdaptiveScaled) or not layer.trainable_weights:
            return clone
        return AdaptiveScaled(clone)

    inputs = None
    if not isinstance(model, keras.Sequential):
        # Fresh inputs with the original names (clone_model would rename them).
        inputs = [
            keras.Input(batch_shape=t.shape, dtype=t.dtype, name=t._keras_history.operation.name)
            for t in keras.tree.flatten(model.input)
        ]
        inputs = keras.tree.pack_sequence_as(model.input, inputs)
    wrapped = keras.models.clone_model(model, input_tensors=inputs, clone_function=wrap)
    wrapped.set_weights(model.get_weights())
    return wrapped


def _is_graph_model(model) -> bool:
    return (
        isinstance(model, keras.Sequential)
        or getattr(model, "_is_graph_network", False)
        or (type(model).__name__ == "Functional")
    )
