"""`AdaptiveLossScaleOptimizer`: layer-wise loss scales chosen from statistics."""

from __future__ import annotations

import math
import numbers
import warnings
import weakref
from typing import NamedTuple

import keras
import tensorflow as tf

from keras_als import (
    _forward_state,
    _plan,
    _scale_state,
    _skip,
    _statistics,
    _step_record,
    _telemetry,
    policies,
)
from keras_als._keras_private import no_automatic_dependency_tracking
from keras_als._telemetry import SKIP_WINDOW
from keras_als.wrapper import owner_of


@keras.saving.register_keras_serializable(package="keras_als")
class AdaptiveLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Loss scaling with one scale per layer, chosen from gradient statistics.

    A drop-in for `keras.optimizers.LossScaleOptimizer` (Zhao, Vogel and Ahmed,
    "Adaptive Loss Scaling for Mixed Precision Training", 2019). Layers wrapped in
    `keras_als.AdaptiveScaled` (see `keras_als.wrap_model`) get scale boundaries
    at their inputs. When the training step is traced, `scale_loss` finds the
    *scale components* of the graph (regions between boundaries) and gives each
    its own power-of-two scale; every boundary converts the gradient crossing it
    from one component's scale to the next. `apply` divides each variable's
    gradient by the scale it was computed at, skips the step (touching no weight
    and no inner optimizer slot) if any gradient is not finite, and asks the
    `policy` for the next scales from what this step measured.

    On a skipped step every component the overflow reached backs off, and a
    component whose measured scale overflowed gains headroom for the spikes
    it met (see `keras_als.policies`); a loss that is not finite moves no
    scale. With float32 compute the chosen scales and scale 1 train to
    bit-identical weights: scales are powers of two. Without a traced graph
    (`run_eagerly=True`) it behaves like `keras.optimizers.LossScaleOptimizer`
    and warns once.

    Args:
        inner_optimizer: The `keras.optimizers.Optimizer` that applies updates.
        policy: A `keras_als.policies` policy or its name: `"max_safe"`
            (default), `"approx_range"` (the paper's rule) or `"fixed"`.
        initial_scale: Scale of every component on the first step: a power of
            two; another number is rounded down to one, with a warning.
        dynamic_growth_steps: Used only where keras_als falls back to Keras's
            one dynamic scale (an eager step, or `apply` without `scale_loss`
            in the same traced function): the scale doubles after this many
            finite steps. Layer-wise scales come from the `policy` instead.
        measure_every_n_steps: How often the boundaries measure the gradients
            and the policy chooses new scales: every n steps, and always on the
            step after a skipped step or while a scale is still moving by
            16x or more per measurement (the paper's `update_per_n_iteration`).
            Between, the scales stay and the boundaries skip their one
            reduction per layer, the main cost of keras_als. Whether a step is
            finite is checked on every step.
        warn_after_skipped_steps: After this many skipped steps in a row (or
            when a quarter of the last `SKIP_WINDOW` steps were skipped),
            `telemetry()` and `ScaleMonitor` report the scaling as stuck and
            raise one `UserWarning` saying where overflows started and what
            usually causes it. Nothing stops or raises on its own.
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
        **kwargs,
    ):
        if not isinstance(inner_optimizer, keras.optimizers.Optimizer):
            raise TypeError(
                "AdaptiveLossScaleOptimizer wraps a keras.optimizers.Optimizer, e.g. "
                f"AdaptiveLossScaleOptimizer(keras.optimizers.Adam()); got {inner_optimizer!r}."
            )
        if isinstance(inner_optimizer, keras.optimizers.LossScaleOptimizer):
            raise ValueError(
                "The inner optimizer is already a LossScaleOptimizer: pass the optimizer "
                "inside it instead (its .inner_optimizer)."
            )
        resolved = policies.get(policy)
        initial_scale = _power_of_two_at_most(initial_scale)
        _check_count("measure_every_n_steps", measure_every_n_steps, " (1 measures every step)")
        _check_count("warn_after_skipped_steps", warn_after_skipped_steps)
        super().__init__(
            inner_optimizer,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            name=name,
            **kwargs,
        )
        self.policy = resolved
        self.measure_every_n_steps = measure_every_n_steps
        self.warn_after_skipped_steps = warn_after_skipped_steps
        self.estimate_underflow = False  # count zeros when measuring (ScaleMonitor sets it)
        self._warned_eager = False
        self._warned_stuck = False

    @no_automatic_dependency_tracking
    def build(self, var_list):
        owners = []
        for v in var_list:
            owner = owner_of(v)
            if owner is not None and all(owner is not o for o in owners):
                owners.append(owner)
        self._scale_owners = owners
        self._scale_names = [o.layer.name for o in owners]

        # Every replica computes the same new values (from all-reduced statistics),
        # so each scale is written in replica context and kept from the first.
        def state(name, dtype="float32", initial=self.initial_scale, shape=()):
            return self.add_variable(
                shape=shape,
                dtype=dtype,
                initializer=keras.initializers.Constant(initial),
                aggregation="only_first_replica",
                name=name,
            )

        # One vector for every layer's scale: one variable costs the compiled
        # step less than one per layer.
        self._layer_scales = state("layer_scales", shape=(len(owners),))
        self.skipped_steps = state("skipped_steps", "int", 0)
        entries = len(self._scale_names) + 1  # the loss's, then each layer's
        # What overflows taught each scale (policies.Headroom), and whether it
        # was ever chosen from a measurement (1) or is still the first guess (0).
        self.headroom = state("headroom", "float32", 0.0, shape=(entries,))
        self.headroom_since = state("headroom_since", "float32", 0.0, shape=(entries,))
        self.measured = state("measured", "int", 0, shape=(entries,))
        # Telemetry: where overflows started and when; the recent skips.
        self.overflow_counts = state("overflow_counts", "int", 0, shape=(entries,))
        self.last_overflow_step = state("last_overflow_step", "float32", -1.0, shape=(entries,))
        self.underflow_rates = state("underflow_rates", "float32", 0.0, shape=(entries,))
        self.zero_rates = state("zero_rates", "float32", 0.0, shape=(entries,))
        self.recent_skips = state("recent_skips", "int", 0, shape=(SKIP_WINDOW,))
        self.skipped_in_a_row = state("skipped_in_a_row", "int", 0)
        # Finite steps since the boundaries last measured.
        self.steps_since_measured = state("steps_since_measured", "int", 0)
        # LossScaleOptimizer's own state, with the aggregation above: the loss's
        # scale, and the growth counter of the one dynamic scale of an eager step.
        self.step_counter = state("step_counter", "int", 0)
        self.dynamic_scale = state("dynamic_scale")
        self.inner_optimizer.build(var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    def scale_owners(self) -> list:
        """The wrapped layers that have a scale variable (empty before `build`)."""
        return list(self._scale_owners) if self.built else []

    def scale_vector(self) -> tf.Tensor:
        """Every scale as one float32 vector: the loss's (entry 0), then each wrapped layer's."""
        if not self.built:
            return tf.constant([float(self.initial_scale)])
        loss = tf.reshape(tf.convert_to_tensor(self.dynamic_scale), [1])
        return tf.concat([loss, tf.convert_to_tensor(self._layer_scales)], axis=0)

    def layer_scales(self) -> dict[str, float]:
        """The current scales: `"loss"` and one per wrapped layer, by layer name.

        Example:

        >>> import keras, keras_als
        >>> keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).layer_scales()
        {'loss': 32768.0}
        """
        if not self.built:
            return {"loss": float(self.initial_scale)}
        values = keras.ops.convert_to_numpy(self.scale_vector())
        return {name: float(v) for name, v in zip(["loss", *self._scale_names], values)}

    @tf.autograph.experimental.do_not_convert
    def scale_loss(self, loss):
        """Multiplies `loss` by its component's scale; plans the backward pass.

        Call it inside the traced step, after the forward pass and before
        `tape.gradient`, as `model.fit` does.
        """
        if not tf.inside_function() or not hasattr(loss, "graph"):
            self._warn_eager()
            return super().scale_loss(loss)
        measuring = None
        if self.built and self.measure_every_n_steps > 1:
            measuring = tf.equal(self.steps_since_measured % self.measure_every_n_steps, 0)
        plan = _plan.make_plan(
            loss,
            _step_record.read(loss.graph).boundaries,
            self.scale_owners(),
            self.scale_vector(),
            self.built,
            measuring,
            count_zeros=bool(self.estimate_underflow),
        )
        _plan.connect(plan)
        _step_record.add_plan(self, plan)
        self._planned_in = weakref.ref(plan.graph)
        return tf.cast(loss, tf.float32) * plan.each_scale[plan.loss_component]

    def _current_plan(self):
        """The plan `scale_loss` made in the step traced now, or None."""
        return _step_record.read().plan_for(self) if tf.inside_function() else None

    def _planned_elsewhere(self) -> bool:
        """True if `scale_loss` last ran in another traced function than this one."""
        planned_in = getattr(self, "_planned_in", None)
        graph = planned_in() if planned_in is not None else None
        return graph is not None and graph is not tf.compat.v1.get_default_graph()

    def _warn_eager(self):
        if not self._warned_eager:
            self._warned_eager = True
            warnings.warn(
                "keras_als: the training step runs eagerly (run_eagerly=True or a custom "
                "loop without tf.function), so there is no graph to plan layer-wise "
                "scales; AdaptiveLossScaleOptimizer uses one dynamic loss scale, like "
                "keras.optimizers.LossScaleOptimizer. Trace the step (the default in "
                "model.compile, or @tf.function) for layer-wise scales.",
                stacklevel=3,
            )

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
        plan = self._current_plan()
        if plan is None:
            scale = self.dynamic_scale if self.built else self.initial_scale
            return [None if g is None else _divide(g, scale) for g in grads]
        return [
            None if g is None else _divide(g, plan.scale_of(v))
            for g, v in zip(grads, trainable_variables)
        ]

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        plan = self._current_plan()
        if plan is None and tf.inside_function() and self._planned_elsewhere():
            raise ValueError(
                "apply() is traced in another tf.function than scale_loss(): the gradients "
                "carry per-layer scales that only the function which called scale_loss() "
                "knows. Call scale_loss, tape.gradient and apply in one traced function."
            )
        if plan is None:
            return super().apply(grads, trainable_variables)
        if not self.built:
            context = tf.distribute.get_replica_context()
            if context is not None and context.num_replicas_in_sync > 1:
                raise ValueError(
                    "Build the optimizer before the distributed training step: "
                    "`with strategy.scope(): optimizer.build(model.trainable_variables)`."
                )
            if trainable_variables is None:
                raise ValueError(
                    "The first call to apply() needs the variables: "
                    "optimizer.apply(grads, model.trainable_variables), or call "
                    "optimizer.build(model.trainable_variables) first."
                )
            with keras.name_scope(self.name, caller=self):
                self.build(trainable_variables)
            self.built = True
        variables = (
            list(trainable_variables)
            if trainable_variables is not None
            else self._trainable_variables
        )
        self._apply_planned(plan, list(grads), variables)

    def _apply_planned(self, plan, grads, variables):
        """One step, in phases: group and unscale the gradients; check that they
        are finite; apply them or skip the step (and learn from the overflow);
        measure and choose the next scales; count the steps until the next
        measurement."""
        gradients = _group_and_unscale(plan, grads, variables, self)
        finite, reached = _check_finite(plan, gradients.weight_amax)
        step = _skip.step_number(self)
        self._apply_or_skip(plan, finite, reached, gradients.unscaled, variables, step)
        if not plan.built:
            return
        measuring = finite if plan.measuring is None else tf.logical_and(plan.measuring, finite)
        unsettled = self._measure_and_choose(plan, gradients, measuring, finite, step)
        if plan.measuring is not None:
            self._count_until_measuring(finite, unsettled)

    def _apply_or_skip(self, plan, finite, reached, unscaled, variables, step):
        """Applies the unscaled gradients if `finite`; else skips the step,
        changing no weight, inner optimizer slot or forward state, and learns from the overflow."""

        def learn():
            _scale_state.learn_from_overflow(self, plan, reached, step)

        _skip.apply_if_finite(
            self, finite, unscaled, variables, step, on_skip=learn if plan.built else None
        )
        _forward_state.restore_unless(finite)

    def _measure_and_choose(self, plan, gradients, measuring, finite, step) -> tf.Tensor:
        """Where `measuring`: measures this step's statistics, asks the policy for
        the next scales and records what was measured. Returns whether a scale
        moved far (it is still settling)."""

        def measured():
            statistics = _statistics.measure(plan, gradients.weight_amax, gradients.weight_grads)
            return _statistics.agree_across_replicas(statistics)

        def update(statistics):
            new = _scale_state.choose_scales(self, plan, statistics, finite, step)
            _scale_state.record_measurement(self, plan, statistics, gradients)
            return _moved_far(plan.scales, new)

        if _statistics.several_replicas():
            # Replicas can neither gather nor assign inside a cond: only the
            # reductions are conditional, the rest keeps every scale when not measuring.
            statistics = _statistics.measure_if(
                measuring, plan, gradients.weight_amax, gradients.weight_grads
            )
            return update(_statistics.agree_across_replicas(statistics))
        # Steps that do not measure keep every scale, at the cost of one branch.
        return tf.cond(measuring, lambda: update(measured()), lambda: tf.constant(False))

    def _count_until_measuring(self, finite, unsettled) -> None:
        """Measures again on the next step after a skipped step or while scales
        move far (they are still settling); else in `measure_every_n_steps`."""
        counted = (self.steps_since_measured + 1) % self.measure_every_n_steps
        again = tf.logical_or(tf.logical_not(finite), unsettled)
        self.steps_since_measured.assign(tf.where(again, tf.zeros_like(counted), counted))

    def telemetry(self) -> dict:
        """Per-layer numbers for monitoring, as plain Python values.

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
            `estimate_underflow` is true (`ScaleMonitor` sets it). And for the
            whole model: `"skipped_steps"` (all), `"recent_skip_rate"` (share
            of the last `SKIP_WINDOW` steps skipped), `"skipped_in_a_row"`,
            `"steps"` (applied and skipped), and `"warning"`: None, or why the
            scaling looks stuck (also raised once as a `UserWarning`).

        Example:

        >>> import keras, keras_als
        >>> telemetry = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).telemetry()
        >>> telemetry["scale"], telemetry["overflows"], telemetry["skipped_steps"]
        ({'loss': 32768.0}, {'loss': 0}, 0)
        """
        telemetry = _telemetry.read(self)
        if telemetry["warning"] is not None and not self._warned_stuck:
            self._warned_stuck = True
            warnings.warn(telemetry["warning"], stacklevel=2)
        return telemetry

    def get_config(self):
        config = super().get_config()  # name, inner_optimizer, initial_scale, dynamic_growth_steps
        config["measure_every_n_steps"] = self.measure_every_n_steps
        config["warn_after_skipped_steps"] = self.warn_after_skipped_steps
        config["policy"] = keras.saving.serialize_keras_object(self.policy)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(
            config.pop("inner_optimizer"), custom_objects=custom_objects
        )
        policy = config.pop("policy", "max_safe")
        if isinstance(policy, dict):
            policy = keras.saving.deserialize_keras_object(policy, custom_objects=custom_objects)
        return cls(inner, policy=policy, **config)


def _check_count(name: str, value, hint: str = "") -> None:
    """Raises a ValueError unless `value` is a whole number >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1{hint}; got {value!r}.")


def _power_of_two_at_most(initial_scale) -> float:
    """`initial_scale` as a float, rounded down to a power of two with a warning.

    Raises:
        ValueError: If it is not a finite number in `[MIN_SCALE, MAX_SCALE]`.
    """
    if (
        isinstance(initial_scale, bool)
        or not isinstance(initial_scale, numbers.Real)
        or not math.isfinite(initial_scale)
        or not policies.MIN_SCALE <= initial_scale <= policies.MAX_SCALE
    ):
        raise ValueError(
            "initial_scale must be a finite number between 2**-24 and 2**64, best a power "
            f"of two such as 2.0**15 (the default); got {initial_scale!r}."
        )
    mantissa, exponent = math.frexp(float(initial_scale))
    scale = math.ldexp(0.5, exponent)
    if mantissa != 0.5:
        warnings.warn(
            f"keras_als: initial_scale={initial_scale!r} is not a power of two; using "
            f"{scale!r} (2**{exponent - 1}), the power of two below it, because keras_als "
            f"scales only by powers of two (exact in floating point). Pass "
            f"initial_scale=2.0**{exponent - 1} to silence this warning.",
            UserWarning,
            stacklevel=3,
        )
    return scale


SETTLING = 2.0**4
"""A scale that moved by this factor or more is still settling: measure again."""


def _not_finite(amaxes: list) -> tf.Tensor:
    """True if any of a component's largest weight gradients is not finite."""
    if not amaxes:
        return tf.constant(False)
    return tf.logical_not(tf.reduce_all(tf.math.is_finite(tf.stack(amaxes))))


class _Gradients(NamedTuple):
    """A step's gradients, grouped by scale component (see `_group_and_unscale`)."""

    weight_grads: list  # per component, its weight gradients (at its scale)
    float16: list  # per component, for each of them, whether computed in float16
    weight_amax: list  # per component, each one's largest absolute value
    unscaled: list  # every gradient divided by its component's scale, in variable order


def _group_and_unscale(plan, grads, variables, optimizer) -> _Gradients:
    """Phase 1: groups the gradients by component and divides each by its
    component's scale."""
    weight_grads = [[] for _ in plan.components]
    float16 = [[] for _ in plan.components]
    unscaled = []
    for g, v in zip(grads, variables):
        if g is None or optimizer._overwrite_variable_with_gradient(v):
            unscaled.append(g)
            continue
        i = plan.index_of(v)
        weight_grads[i].append(g)
        float16[i].append(_computed_in_float16(v))
        unscaled.append(_divide(g, plan.each_scale[i]))
    weight_amax = [[_statistics.amax(g) for g in group] for group in weight_grads]
    return _Gradients(weight_grads, float16, weight_amax, unscaled)


def _check_finite(plan, weight_amax) -> tuple[tf.Tensor, tf.Tensor]:
    """Phase 2: whether every gradient is finite on every replica, and which
    components an overflow reached.

    Non-finite weight gradients mark the components an overflow reached: where
    it started and every component upstream of it. On measuring steps the
    gradients entering each component's wrapped layers are reduced too (else
    they read 0): a non-finite one counts. With a loss that is not finite, the
    forward pass (the data) is to blame, not the scales: it reaches none.
    """
    crossed = {}
    if plan.crossings is not None:
        plan.crossings.finish()  # the boundaries' gradients that still wait
        crossed = plan.crossings.reduced
    not_finite = tf.stack(
        [
            _not_finite(group + [crossed[id(b)].amax for b in c.inside if id(b) in crossed])
            for group, c in zip(weight_amax, plan.components)
        ]
    )
    finite = tf.logical_not(tf.reduce_any(_statistics.reached_on_any_replica(not_finite)))
    reached = _statistics.reached_on_any_replica(tf.logical_and(not_finite, plan.loss_finite))
    return finite, reached


def _computed_in_float16(variable) -> bool:
    """Whether the layer that owns `variable` computes in float16 (else the global policy)."""
    owner = owner_of(variable)
    dtype = owner.layer.compute_dtype if owner is not None else None
    return (dtype or keras.config.dtype_policy().compute_dtype) == "float16"


def _moved_far(old: tf.Tensor, new: tf.Tensor) -> tf.Tensor:
    """True if some scale changed by a factor of `SETTLING` or more."""
    ratio = new / old
    return tf.reduce_any(tf.logical_or(ratio >= SETTLING, ratio <= 1.0 / SETTLING))


def _divide(gradient, scale):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(
            _divide(gradient.values, scale), gradient.indices, gradient.dense_shape
        )
    if gradient.dtype == tf.float32:
        return gradient / scale
    return tf.cast(tf.cast(gradient, tf.float32) / scale, gradient.dtype)
