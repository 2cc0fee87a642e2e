"""`calibrate`: every scale chosen from one float32 measurement, before a step is lost.

Without it the first scales are a guess (`initial_scale`, 2**15), and a
model whose first gradients exceed float16's range at that guess skips steps
until the scales have backed off far enough: on KerasHub's Swin on black
canvases 9 to 14 steps, each of them an update float32 applies. Those first
updates are not negligible there: float32 trained without its first 9 steps
lands where keras_als does, and far from float32 trained on all of them
(`benchmarks/flat_regions`). `calibrate` runs the training computation once
on a batch with every layer computing in float32, where nothing overflows,
measures each scale component's gradients as a measuring step does, and
lets the policy choose the scales from them: the first step then runs at
scales that hold its gradients.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from keras_als.float32._forward_checks import loss_of, policies_kept, state_kept, to_float32
from keras_als.optimizer import AdaptiveLossScaleOptimizer
from keras_als.step import _apply_phases, _step_record
from keras_als.telemetry import _mistakes


def calibrate(
    model: keras.Model,
    x,
    y=None,
    loss: Callable | None = None,
    optimizer: AdaptiveLossScaleOptimizer | None = None,
) -> dict[str, float]:
    """Chooses every scale of `optimizer` from `model`'s float32 gradients on `(x, y)`.

    One forward and backward pass in training mode, traced, with every layer
    computing in float32 (policies restored after): each scale component's
    largest gradient is measured as on a measuring step and the optimizer's
    policy chooses the scales from it. No update is applied: the weights,
    the inner optimizer's slots and iterations, the skipped-step counters,
    the model's non-trainable variables (moving statistics, seed generators)
    and its metrics are left as they were. Before the first update no scale
    rises (as on a measuring step: one update can move the gradients of the
    initial weights by orders of magnitude); the first steps measure again.

    Call it after `compile` and before `fit` or a custom loop's first step
    (`Float32Fallback` calls it when `fit` begins). With float32 compute the
    scales it chooses are powers of two like any others: training is
    bit-identical to training without it.

    Args:
        model: A model instrumented by `keras_als.wrap_model` (or holding
            `AdaptiveScaled` layers).
        x: One batch of inputs, as `model` takes them.
        y: Its targets.
        loss: `loss(y, y_pred)`, a scalar. None: the model's own
            (`model.compute_loss`; the model must be compiled).
        optimizer: The `AdaptiveLossScaleOptimizer` to calibrate. None:
            `model.optimizer`.

    Returns:
        The new scales, `optimizer.layer_scales()`.

    Example:

    >>> import keras, numpy as np, keras_als
    >>> model = keras_als.wrap_model(keras.Sequential([
    ...     keras.Input((4,)),
    ...     keras.layers.Dense(4, name="huge",
    ...                        kernel_initializer=keras.initializers.Constant(1e4)),
    ...     keras.layers.Dense(1, name="head")]))
    >>> model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()), "mse")
    >>> scales = keras_als.calibrate(model, np.ones((8, 4), "float32"), np.zeros((8, 1)))
    >>> scales["loss"] < 2.0**15
    True
    """
    optimizer = _mistakes.adaptive_optimizer(
        model.optimizer if optimizer is None else optimizer,
        AdaptiveLossScaleOptimizer,
        "keras_als.calibrate",
        or_else=", or pass one as calibrate(..., optimizer=...)",
    )
    _mistakes.measurable(model, loss, "keras_als.calibrate")
    variables = model.trainable_variables
    if not optimizer.built:
        optimizer.build(variables)
    x = tf.nest.map_structure(tf.convert_to_tensor, x)

    @tf.function
    def measure(x, y):
        _step_record.measure_this_step()
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True)
            scaled = optimizer.scale_loss(loss_of(model, x, y, y_pred, loss))
        grads = tape.gradient(scaled, variables)
        _apply_phases.measure_only(
            optimizer.scaling, _step_record.plan_now(optimizer), grads, variables
        )

    with state_kept(model), policies_kept(model):
        to_float32([model])
        measure(x, y)
    return optimizer.layer_scales()
