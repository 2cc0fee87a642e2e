"""`AdaptiveScaled`: one layer given its own loss scale, by hand.

`keras_als.wrap_model` instruments a whole model in place; `AdaptiveScaled`
is the wrapper layer for placing a scale where a model's code creates a
layer (see the guide on subclassed models). Both scale a call the same way
(`_layer_call`).
"""

from __future__ import annotations

import keras

from keras_als._keras_private import converts_inputs, has_own_output_spec, set_converts_inputs
from keras_als.step import _layer_call


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
        set_converts_inputs(self, False)

    def build(self, *args, **kwargs):
        # The wrapped layer builds itself on its first call, with its own signature.
        self.built = True
        self._declare_weights()

    @property
    def scale_path(self) -> str:
        """The name of this wrapper's scale: the wrapped layer's."""
        return self.layer.name

    @property
    def state_variables(self) -> list:
        """What a forward call of the wrapped layer may update (BatchNormalization's statistics)."""
        return self.layer.non_trainable_variables

    def _declare_weights(self):
        _layer_call.declare(self)

    def call(self, *args, **kwargs):
        return _layer_call.call_scaled(
            self,
            self.layer,
            args,
            kwargs,
            cast=self._as_layer_input,
            scale_outputs=self.scale_outputs,
        )

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
