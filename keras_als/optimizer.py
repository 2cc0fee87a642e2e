"""`AdaptiveLossScaleOptimizer`: layer-wise loss scales chosen from statistics."""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

from keras_als import policies
from keras_als._keras_private import (
    no_automatic_dependency_tracking,
    track_optimizer_variable,
    trainable_variables_of,
)
from keras_als.step import _apply_phases, _early_build, _entries, _plan, _state, _step_record
from keras_als.telemetry import _mistakes, _telemetry


@keras.saving.register_keras_serializable(package="keras_als")
class AdaptiveLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Loss scaling with one scale per layer, chosen from gradient statistics.

    A drop-in for `keras.optimizers.LossScaleOptimizer` (Zhao, Vogel and Ahmed,
    "Adaptive Loss Scaling for Mixed Precision Training", 2019). The layers of a
    model instrumented by `keras_als.wrap_model` (or wrapped in
    `keras_als.AdaptiveScaled`) get scale boundaries at their inputs. When the
    training step is traced, `scale_loss` finds the *scale components* of the
    graph (regions between boundaries) and gives each its own power-of-two
    scale; every boundary converts the gradient crossing it from one
    component's scale to the next (built there by `fit`, it makes its
    variables eagerly, so that TensorFlow traces the step once). `apply`
    divides each variable's gradient by the scale it was computed at, skips
    the step (touching no weight and no inner optimizer slot) if any gradient
    is not finite, and asks the `policy` for the next scales from what this
    step measured (before the first update is applied no scale rises:
    gradients of the initial weights can grow by orders of magnitude with it).

    On a skipped step every component the overflow reached backs off, and a
    component whose measured scale overflowed gains headroom for the spikes
    it met (see `keras_als.policies`); a loss that is not finite moves no
    scale. With float32 compute the chosen scales and scale 1 train to
    bit-identical weights: scales are powers of two. Without a traced graph
    (`run_eagerly=True`) it behaves like `keras.optimizers.LossScaleOptimizer`
    and warns once.

    Args:
        inner_optimizer: The `keras.optimizers.Optimizer` that applies updates,
            or its name (`"adam"`) or config, as `model.compile` takes one.
            Clipping and weight decay are its arguments: it sees the
            unscaled gradients.
        policy: A `keras_als.policies` policy or its name: `"max_safe"`
            (default), `"approx_range"` (the paper's rule) or `"fixed"`.
        initial_scale: Scale of every component on the first step: a power of
            two; another number is rounded down to one, with a warning.
        dynamic_growth_steps: Used only where keras_als falls back to Keras's
            one dynamic scale (an eager step, or `apply` without `scale_loss`
            in the same traced function): the scale doubles after this many
            finite steps. Layer-wise scales come from the `policy` instead.
        measure_every_n_steps: The longest period between steps that measure
            the gradients and let the `policy` choose new scales (the paper's
            `update_per_n_iteration`). The step after a skipped step measures,
            and so do the step after the first and the step after a blind
            growth (gradients all zero); else the period doubles up to this
            (1, 2, 4, 8, 16), and shrinks while gradients grow, to the longest
            in which growth at the rate last measured stays within 3 binades
            (a scale that fell 8-fold in 8 steps keeps 8). Between, the
            scales stay and the boundaries skip their one reduction per
            layer, the main cost of keras_als. Whether a step is finite is
            checked on every step.
        warn_after_skipped_steps: After this many skipped steps in a row (or
            when a quarter of the last `SKIP_WINDOW` steps were skipped),
            `telemetry()` and `ScaleMonitor` report the scaling as stuck and
            raise one `UserWarning` saying where overflows started and what
            usually causes it; so does the end of every `fit`. Nothing stops
            or raises on its own.
        estimate_underflow: Count zeros and float16 subnormals on the steps
            that measure, for the `"underflow_rate"` of `telemetry()`
            (`ScaleMonitor` turns it on). Read when the step is traced.
        name: Optional name.

    Example:

    >>> import keras, numpy as np, keras_als
    >>> model = keras_als.wrap_model(keras.Sequential(
    ...     [keras.Input((4,)), keras.layers.Dense(8, activation="relu", name="hidden"),
    ...      keras.layers.Dense(1, name="out")]))
    >>> optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.1))
    >>> model.compile(optimizer=optimizer, loss="mse")
    >>> _ = model.fit(np.ones((8, 4)), np.ones((8, 1)), epochs=2, verbose=0)
    >>> sorted(optimizer.layer_scales())
    ['hidden', 'loss', 'out']
    """

    # Fields of `scaling`, the `_state.ScaleState` given to the step (all it reads and writes).
    policy = _state.Setting()
    measure_every_n_steps = _state.Setting()
    warn_after_skipped_steps = _state.Setting()
    estimate_underflow = _state.Setting()

    def __init__(
        self,
        inner_optimizer: keras.optimizers.Optimizer,
        initial_scale: float = 2.0**15,
        dynamic_growth_steps: int = 2000,
        name: str | None = None,
        *,
        policy: str | policies.Policy = "max_safe",
        measure_every_n_steps: int = 16,
        warn_after_skipped_steps: int = 20,
        estimate_underflow: bool = False,
        **kwargs,
    ):
        inner_optimizer = _mistakes.inner(inner_optimizer)
        _mistakes.no_base_arguments(kwargs)
        resolved = policies.get(policy)
        initial_scale = _mistakes.power_of_two_at_most(initial_scale)
        _mistakes.count("measure_every_n_steps", measure_every_n_steps, " (1 measures every step)")
        _mistakes.count("warn_after_skipped_steps", warn_after_skipped_steps)
        # By keyword: Keras 3.10's LossScaleOptimizer takes `name` by keyword only.
        super().__init__(
            inner_optimizer,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            name=name,
            **kwargs,
        )
        self.scaling = _state.ScaleState(
            inner_optimizer,
            initial_scale,
            policy=resolved,
            measure_every_n_steps=measure_every_n_steps,
            warn_after_skipped_steps=warn_after_skipped_steps,
            estimate_underflow=bool(estimate_underflow),
        )

    def build(self, var_list):
        _build_around(self, self.scaling.build(self.add_variable, var_list), var_list)

    @property
    def skipped_steps(self) -> tf.Tensor:
        """Steps skipped so far (`iterations` counts the applied ones); after `build`."""
        return self.scaling.skipped_steps

    def skipped_step_count(self) -> int:
        """`skipped_steps` as a Python int, in one variable read (0 before
        `build`): cheap enough for a callback to read before every batch."""
        return self.scaling.counter_value("skipped_steps")

    def layer_scales(self) -> dict[str, float]:
        """The current scales: `"loss"` and one per wrapped layer, by layer name.

        Example:

        >>> import keras, keras_als
        >>> keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).layer_scales()
        {'loss': 32768.0}
        """
        return _telemetry.layer_scales(self.scaling)

    @tf.autograph.experimental.do_not_convert
    def scale_loss(self, loss):
        """Multiplies `loss` by its component's scale; plans the backward pass.

        Call it inside the traced step, after the forward pass and before
        `tape.gradient`, as `model.fit` does.
        """
        if not tf.inside_function() or not hasattr(loss, "graph"):
            _mistakes.warn_eager(self)
            return super().scale_loss(loss)
        record = _step_record.read(loss.graph)
        _build_scales_ahead(self, record)  # then `fit` traces the step once
        plan = _plan.plan_for(self.scaling, loss, record.boundaries, record.measures)
        if self.built and not plan.boundaries() and not _entries.scaled(self.scaling):
            _mistakes.warn_no_boundaries(self)
        _plan.connect(plan)
        _step_record.add_plan(self, plan)
        return tf.cast(loss, tf.float32) * plan.scales[plan.loss_component]

    @tf.autograph.experimental.do_not_convert
    def unscale(self, grads, trainable_variables):
        """Divides each gradient by the scale it was computed at.

        `apply` does this itself; call `unscale` to inspect the true gradients
        (or clip them) in a custom step, after `scale_loss` and `tape.gradient`
        in the same traced function.

        Args:
            grads: Gradients of the scaled loss, one per variable (None allowed).
            trainable_variables: The variables, in the same order.

        Returns:
            The unscaled gradients, as a list.

        Example:

        >>> import keras, tensorflow as tf, keras_als
        >>> model = keras_als.wrap_model(keras.Sequential(
        ...     [keras.Input((2,)), keras.layers.Dense(1, use_bias=False)]))
        >>> optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
        >>> @tf.function
        ... def true_gradient(x):
        ...     with tf.GradientTape() as tape:
        ...         scaled = optimizer.scale_loss(tf.reduce_sum(model(x)))
        ...     grads = tape.gradient(scaled, model.trainable_variables)
        ...     return optimizer.unscale(grads, model.trainable_variables)
        >>> true_gradient(tf.constant([[1.0, 2.0]]))[0].numpy().ravel()
        array([1., 2.], dtype=float32)
        """
        plan = _step_record.plan_now(self)
        return _apply_phases.unscale_each(self.scaling, plan, grads, trainable_variables)

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        """Unscales `grads` and applies them, or skips the step if one is not finite.

        In a traced step after `scale_loss`, each gradient is divided by its
        layer's scale, and the scales for the next steps are chosen here;
        otherwise this is `keras.optimizers.LossScaleOptimizer.apply`.
        """
        plan = _step_record.plan_now(self)
        if plan is None:
            if tf.inside_function():
                _mistakes.unscaled_apply(self)
            return super().apply(grads, trainable_variables)
        if not self.built and not _adopt_scales_built_ahead(self, trainable_variables):
            _mistakes.build_inside_step(self, trainable_variables)
        if trainable_variables is None:
            trainable_variables = trainable_variables_of(self)
        _apply_phases.run(self.scaling, plan, list(grads), list(trainable_variables))

    def telemetry(self, warn: bool = True) -> dict:
        """Per-layer numbers for monitoring, as plain Python values.

        Args:
            warn: Whether to give the warnings below (a `UserWarning`, once each); a
                callback that acts on the numbers itself passes False.

        Returns:
            A dict. Per name of `layer_scales()` (`"loss"` and each wrapped
            layer):

            - `"scale"`: the current scale;
            - `"headroom"`: binades of headroom learned from overflows (the
              scale plans for gradients `2**headroom` times those measured);
            - `"underflow_rate"`: the share of the component's float16
              gradient values (its layers' input and weight gradients) that
              are subnormal, non-zero and below `2**-14`, where underflow
              starts; near 0 where scaling loses nothing, 1 where the
              component's gradient flushed to zero whole;
            - `"zero_rate"`: the share of exact zeros, true zeros (dead ReLU
              units, anchors left out of a loss) included;
            - `"overflows"`: skipped steps whose overflow started there;
            - `"last_overflow_step"`: the step of the latest (-1: never).

            Both rates are measured on the steps that measure the scales once
            `estimate_underflow` is true (`ScaleMonitor` sets it); without it,
            `"underflow_rate"` is 1 where the component's gradient flushed to
            zero whole on the last measuring step, 0 elsewhere, and
            `"zero_rate"` is 0. For the whole model: `"skipped_steps"` (all),
            `"recent_skip_rate"` (share of the last `SKIP_WINDOW` steps
            skipped), `"skipped_in_a_row"`, `"loss_not_finite"` (steps of the
            last `SKIP_WINDOW` skipped because the loss itself was not finite),
            `"steps"` (applied and skipped), `"beyond_float16"`: the layers
            where an overflow started at a scale below 1 on any step (their
            gradients exceed float16's largest value), `"needs_float32"`:
            those of them computing in float16 whose gradients also underflow
            (half or more) at their scale, and `"warning"`: None, or why the
            scaling looks stuck (naming `diagnose` and `Float32Fallback` where
            the loss itself was not finite). Each is said once as a
            `UserWarning` naming the fix, here and at the end of `fit`.

        Example:

        >>> import keras, keras_als
        >>> telemetry = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).telemetry()
        >>> telemetry["scale"], telemetry["overflows"], telemetry["skipped_steps"]
        ({'loss': 32768.0}, {'loss': 0}, 0)
        """
        telemetry = _telemetry.read(self.scaling)
        if warn:
            _mistakes.warn_from_telemetry(self, telemetry)
        return telemetry

    def finalize_variable_values(self, var_list):
        # Keras calls this at the end of every `fit`: a stuck scaling, or layers float16
        # cannot train, are said there, whether a ScaleMonitor reads the telemetry or not.
        super().finalize_variable_values(var_list)
        if self.built:
            _mistakes.warn_from_telemetry(self, _telemetry.read(self.scaling), stacklevel=4)

    def summary(self, print_fn=print) -> None:
        """Prints one line per scale: its name, value, headroom and overflows.

        Example:

        >>> import keras, keras_als
        >>> keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).summary()
        scale     value     headroom  overflows
        loss      2**15     0         0
        skipped steps: 0 of 0
        """
        print_fn(_telemetry.table(self.telemetry()))

    def get_config(self):
        config = super().get_config()  # name, inner_optimizer, initial_scale, dynamic_growth_steps
        config["measure_every_n_steps"] = self.measure_every_n_steps
        config["warn_after_skipped_steps"] = self.warn_after_skipped_steps
        config["estimate_underflow"] = self.estimate_underflow
        config["policy"] = keras.saving.serialize_keras_object(self.policy)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        inner, policy, config = _deserialized(config, custom_objects)
        return cls(inner, policy=policy, **config)


@no_automatic_dependency_tracking
def _build_around(optimizer, made: tuple, var_list) -> None:
    """Builds the rest of `optimizer` around its scale variables `made`
    (`ScaleState.build`'s, made by `build` or ahead of it, `_build_scales_ahead`)."""
    _mistakes.warn_bfloat16(optimizer)
    optimizer.scale_state, optimizer.step_counter, optimizer.dynamic_scale = made  # saved names
    optimizer.inner_optimizer.build(var_list)
    keras.optimizers.Optimizer.build(optimizer, var_list)


def _build_scales_ahead(optimizer, record) -> None:
    """Makes `optimizer`'s scale variables, untracked, in a step traced before
    it is built, for the variables of the model the step entered (`_early_build`)."""
    variables = _early_build.variables_to_build_for(optimizer.scaling, record)
    if variables:  # none once built: `build` makes the scale variables first
        with _early_build.made_eagerly():
            optimizer.scaling.build(functools.partial(_untracked_variable, optimizer), variables)


def _adopt_scales_built_ahead(optimizer, trainable_variables) -> bool:
    """Builds `optimizer` eagerly around the scale variables made ahead, if
    they were made for `trainable_variables`; False if the caller must build it."""
    if not _early_build.made_for(optimizer.scaling, trainable_variables):
        return False
    state = optimizer.scaling
    made = (state.scale_state, state.step_counter, state.dynamic_scale)
    with _early_build.made_eagerly(), keras.name_scope(optimizer.name, caller=optimizer):
        for variable in made:
            track_optimizer_variable(optimizer, variable)
        _build_around(optimizer, made, list(trainable_variables))
    optimizer.built = True
    return True


def _untracked_variable(optimizer, shape, initializer, dtype=None, aggregation="none", name=None):
    """What `optimizer.add_variable` makes, not yet one of `optimizer.variables`."""
    with keras.name_scope(optimizer.name, caller=optimizer):
        return keras.Variable(
            initializer=initializer,
            shape=shape,
            dtype=dtype,
            trainable=False,
            aggregation=aggregation,
            name=name,
        )


def _deserialized(config: dict, custom_objects=None) -> tuple:
    """`(inner optimizer, policy, the rest of config)` from `get_config`'s dict."""
    config = dict(config)
    inner = keras.saving.deserialize_keras_object(
        config.pop("inner_optimizer"), custom_objects=custom_objects
    )
    policy = config.pop("policy", "max_safe")
    if isinstance(policy, dict):
        policy = keras.saving.deserialize_keras_object(policy, custom_objects=custom_objects)
    return inner, policy, config
