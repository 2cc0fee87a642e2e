"""The methods compared: one way to train each, and the gradients it really applies.

A *method* is one way to train: float32, Keras's `LossScaleOptimizer`, a fixed
global scale, or keras_als with a policy. `Method.build(builder, weights)`
returns a model and optimizer ready for a training step, built under the
method's precision with the given initial weights, so that every method starts
from the same point.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import keras
import numpy as np
import tensorflow as tf

import keras_als
from keras_als import policies

Builder = Callable[[], keras.Model]


@contextlib.contextmanager
def precision(name: str) -> Iterator[None]:
    """Sets the global Keras dtype policy for the block, then restores float32.

    Args:
        name: `"float32"` or `"mixed_float16"`.
    """
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy("float32")


@dataclasses.dataclass(frozen=True)
class Method:
    """One way to train a model.

    Attributes:
        name: Short name used in every table.
        kind: `"float32"`, `"none"` (mixed_float16 with the inner optimizer
            alone: no loss scale, no skipped step), `"keras_lso"` (Keras
            `LossScaleOptimizer`, defaults) or `"als"`
            (`keras_als.AdaptiveLossScaleOptimizer`).
        policy: The keras_als policy (kind `"als"` only).
        wrap: Whether the model is wrapped with `keras_als.wrap_model` (layer-wise
            scales); an unwrapped model has one global scale, the loss's.
        initial_scale: keras_als's scale on the first step.
        measure_every_n_steps: keras_als's statistics period (None: its default).
        label: What the method is, for the README tables.
    """

    name: str
    kind: str
    policy: object = None
    wrap: bool = False
    initial_scale: float = 2.0**15
    measure_every_n_steps: int | None = None
    label: str = ""

    @property
    def mixed(self) -> bool:
        """True for every float16 method."""
        return self.kind != "float32"

    def optimizer(self, inner: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        """Wraps `inner` the way this method trains."""
        if self.kind in ("float32", "none"):
            return inner
        if self.kind == "keras_lso":
            return keras.optimizers.LossScaleOptimizer(inner)
        period = {}
        if self.measure_every_n_steps is not None:
            period["measure_every_n_steps"] = self.measure_every_n_steps
        return keras_als.AdaptiveLossScaleOptimizer(
            inner, policy=self.policy, initial_scale=self.initial_scale, **period
        )

    def build(
        self,
        builder: Builder,
        weights: list[np.ndarray] | None = None,
        inner: keras.optimizers.Optimizer | None = None,
    ) -> tuple[keras.Model, keras.optimizers.Optimizer]:
        """A fresh model (under this method's precision) and its optimizer.

        Args:
            builder: Returns a new, built, unwrapped model.
            weights: Initial weights (`model.get_weights()` order), or None.
            inner: The inner optimizer; Adam(1e-3) if None.

        Returns:
            `(model, optimizer)`; the model is wrapped for layer-wise methods.
        """
        with precision("mixed_float16" if self.mixed else "float32"):
            model = builder()
            if weights is not None:
                model.set_weights(weights)
            if self.wrap:
                model = keras_als.wrap_model(model)
        return model, self.optimizer(inner or keras.optimizers.Adam(1e-3))


def loss_scaled(
    model: keras.Model, inner: keras.optimizers.Optimizer, *, wrap: bool, adaptive: bool
) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """The two sides of every cost comparison, with their defaults: `model`,
    wrapped in place by `keras_als.wrap_model` if `wrap`, and `inner` under
    `keras_als.AdaptiveLossScaleOptimizer` if `adaptive`, else under Keras's
    `LossScaleOptimizer`."""
    if wrap:
        keras_als.wrap_model(model)
    if adaptive:
        return model, keras_als.AdaptiveLossScaleOptimizer(inner)
    return model, keras.optimizers.LossScaleOptimizer(inner)


def fixed(scale: float) -> Method:
    """One global fixed scale: keras_als's `Fixed` policy on an unwrapped model."""
    return Method(
        f"fixed_{int(scale)}",
        "als",
        policies.Fixed(default=scale),
        wrap=False,
        initial_scale=scale,
        label=f"global fixed scale {int(scale)} (keras_als Fixed, unwrapped model; "
        "skips a non-finite step)",
    )


FLOAT32 = Method("float32", "float32", label="float32 everywhere (reference)")
NO_SCALING = Method(
    "mixed_no_scaling", "none", label="mixed_float16, no loss scaling (inner optimizer alone)"
)
KERAS_LSO = Method(
    "keras_lso",
    "keras_lso",
    label="keras.optimizers.LossScaleOptimizer, defaults (2^15, x2 per 2000 clean steps)",
)
ALS_MAX_SAFE = Method(
    "als_max_safe", "als", policies.MaxSafe(), wrap=True, label="keras_als, MaxSafe(margin=6)"
)
ALS_APPROX = Method(
    "als_approx_range",
    "als",
    policies.ApproxRange(),
    wrap=True,
    label="keras_als, ApproxRange (paper bounds: ratio 16, scale 1024)",
)
ALS_APPROX_UNBOUNDED = Method(
    "als_approx_unbounded",
    "als",
    policies.ApproxRange(max_ratio=None, max_scale=None),
    wrap=True,
    label="keras_als, ApproxRange without the paper's bounds",
)

ALL_METHODS: tuple[Method, ...] = (
    FLOAT32,
    KERAS_LSO,
    fixed(1.0),
    fixed(128.0),
    fixed(2.0**15),
    ALS_MAX_SAFE,
    ALS_APPROX,
    ALS_APPROX_UNBOUNDED,
)


def true_gradients(
    optimizer: keras.optimizers.Optimizer, grads: list[tf.Tensor], variables: list
) -> list[tf.Tensor]:
    """Unscaled gradients inside a traced step, for any of the methods.

    Args:
        optimizer: The method's optimizer (after `scale_loss` in the same trace).
        grads: Gradients of the scaled loss.
        variables: The trainable variables, in the same order.
    """
    if isinstance(optimizer, keras_als.AdaptiveLossScaleOptimizer):
        return optimizer.unscale(grads, variables)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        scale = tf.cast(optimizer.dynamic_scale, tf.float32)
        return [tf.cast(g, tf.float32) / scale for g in grads]
    return list(grads)


def scale_loss(optimizer: keras.optimizers.Optimizer, loss: tf.Tensor) -> tf.Tensor:
    """`optimizer.scale_loss(loss)` for loss-scaling optimizers, else `loss`."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.scale_loss(loss)
    return loss


def skipped_steps(optimizer: keras.optimizers.Optimizer, steps_run: int) -> int:
    """Steps run but not applied (non-finite gradients): `steps_run - iterations`."""
    return int(steps_run) - int(keras.ops.convert_to_numpy(optimizer.iterations))


def skipped(optimizer: keras.optimizers.Optimizer, steps: int) -> int:
    """Steps skipped so far after `steps` steps: keras_als's own `skipped_steps`
    counter; for any other optimizer, `skipped_steps` (steps run - iterations)."""
    if isinstance(optimizer, keras_als.AdaptiveLossScaleOptimizer):
        return int(optimizer.skipped_steps.numpy())
    return skipped_steps(optimizer, steps)


def prebuild(model: keras.Model) -> None:
    """Builds a compiled model's optimizer now, on its trainable variables.

    Without a distribution strategy, Keras's TensorFlow trainer builds the
    optimizer inside the first traced step, and `tf.function` traces a
    function that creates variables twice: half of a large model's first
    step (MobileNetV2's 42 s in a TensorFlow graph, 22 s so). The steps
    themselves are the same. Runs that time the first step do not call
    this: it is what a user's `fit` pays.
    """
    model.optimizer.build(model.trainable_variables)
