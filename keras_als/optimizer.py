"""`AdaptiveLossScaleOptimizer`: layer-wise loss scales chosen from statistics."""

from __future__ import annotations

import math
import numbers
import warnings
import weakref

import keras
import tensorflow as tf
from keras.src.utils import tracking

from keras_als import _forward_state, _plan, _statistics, policies

_OWNER = "_keras_als_owner"


def mark_owner(wrapper, variables) -> None:
    """Tags `variables` as weights of `wrapper`, so the optimizer can find it."""
    for v in variables:
        setattr(v, _OWNER, weakref.ref(wrapper))


def _owner(variable):
    ref = getattr(variable, _OWNER, None)
    return ref() if ref is not None else None


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

    With float32 compute the result equals training without scaling exactly:
    scales are powers of two. Without a traced graph (`run_eagerly=True`) it
    behaves like `keras.optimizers.LossScaleOptimizer` and warns once.

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
        if (
            isinstance(measure_every_n_steps, bool)
            or not isinstance(measure_every_n_steps, int)
            or measure_every_n_steps < 1
        ):
            raise ValueError(
                "measure_every_n_steps must be a whole number >= 1 (1 measures every step); "
                f"got {measure_every_n_steps!r}."
            )
        super().__init__(
            inner_optimizer,
            initial_scale=initial_scale,
            dynamic_growth_steps=dynamic_growth_steps,
            name=name,
            **kwargs,
        )
        self.policy = resolved
        self.measure_every_n_steps = measure_every_n_steps
        self.estimate_underflow = False  # count zeros when measuring (ScaleMonitor sets it)
        self._warned_eager = False

    @tracking.no_automatic_dependency_tracking
    def build(self, var_list):
        owners = []
        for v in var_list:
            owner = _owner(v)
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
        slots = len(self._scale_names) + 1  # the loss's, then each layer's
        self.overflow_counts = state("overflow_counts", "int", 0, shape=(slots,))
        self.underflow_rates = state("underflow_rates", "float32", 0.0, shape=(slots,))
        # LossScaleOptimizer's own state, with the aggregation above. Here
        # `step_counter` counts finite steps since the boundaries last measured.
        self.step_counter = state("step_counter", "int", 0)
        self.dynamic_scale = state("dynamic_scale")
        self.inner_optimizer.build(var_list)
        keras.optimizers.Optimizer.build(self, var_list)

    def scale_owners(self) -> list:
        """The wrapped layers that have a scale variable (empty before `build`)."""
        return list(self._scale_owners) if self.built else []

    def scale_slot_for(self, wrapper) -> int | None:
        """The slot of a wrapped layer in `slot_scales()`, or None if it has none."""
        if not self.built:
            return None
        for i, owner in enumerate(self._scale_owners):
            if owner is wrapper:
                return 1 + i
        return None

    def slot_scales(self) -> tf.Tensor:
        """Every scale as one float32 vector: the loss's (slot 0), then each layer's."""
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
        values = keras.ops.convert_to_numpy(self.slot_scales())
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
        plan = _plan.make_plan(loss, self)
        if plan.built:
            measuring = None
            if self.measure_every_n_steps > 1:
                measuring = tf.equal(self.step_counter % self.measure_every_n_steps, 0)
            plan.measure_when(measuring, count_zeros=bool(self.estimate_underflow))
        _plan.remember(self, plan)
        return tf.cast(loss, tf.float32) * plan.scales[plan.loss_component]

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
        plan = _plan.current(self)
        if plan is None:
            scale = self.dynamic_scale if self.built else self.initial_scale
            return [None if g is None else _divide(g, scale) for g in grads]
        return [
            None if g is None else _divide(g, plan.scale_of(v))
            for g, v in zip(grads, trainable_variables)
        ]

    @tf.autograph.experimental.do_not_convert
    def apply(self, grads, trainable_variables=None):
        plan = _plan.current(self)
        if plan is None and tf.inside_function() and _plan.made_elsewhere(self):
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
        weight_grads = [[] for _ in plan.components]
        unscaled = []
        for g, v in zip(grads, variables):
            if g is None or self._overwrite_variable_with_gradient(v):
                unscaled.append(g)
                continue
            i = plan.index_of(v)
            weight_grads[i].append(g)
            unscaled.append(_divide(g, plan.scales[i]))
        weight_amax = [[_statistics.amax(g) for g in group] for group in weight_grads]
        all_weight_amax = [a for group in weight_amax for a in group]
        finite = (
            tf.reduce_all(tf.math.is_finite(tf.stack(all_weight_amax)))
            if all_weight_amax
            else tf.constant(True)
        )
        finite = _statistics.finite_on_every_replica(finite)
        self._apply_if_finite(finite, unscaled, variables)
        _forward_state.restore_unless(finite)
        if not plan.built:
            return
        plan.crossings.finish()  # the boundaries' gradients that still wait

        def measured():
            statistics = _statistics.measure(plan, weight_amax, weight_grads)
            return _statistics.agree_across_replicas(statistics)

        def update_scales(statistics):
            new = policies.next_scale(self.policy, statistics, plan.scales)
            self._assign_scales(plan, new)
            self._record_telemetry(plan, statistics, weight_grads)
            return _moved_far(plan.scales, new)

        if plan.measuring is None:
            update_scales(measured())
            return
        if _statistics.several_replicas():
            # Replicas can neither gather nor assign inside a cond: only the
            # reductions are conditional, the rest keeps every scale when not measuring.
            statistics = _statistics.measure_if(plan.measuring, plan, weight_amax, weight_grads)
            unsettled = update_scales(_statistics.agree_across_replicas(statistics))
        else:  # steps that do not measure keep every scale, at the cost of one branch
            unsettled = tf.cond(
                plan.measuring, lambda: update_scales(measured()), lambda: tf.constant(False)
            )
        # Measure again on the next step after a skipped step or while scales
        # move far (they are still settling); else in n steps.
        counted = (self.step_counter + 1) % self.measure_every_n_steps
        again = tf.logical_or(tf.logical_not(finite), unsettled)
        self.step_counter.assign(tf.where(again, tf.zeros_like(counted), counted))

    def _assign_scales(self, plan, new):
        """Writes the new scale of every component into each of its slots."""
        slots, components = _slots_of(plan)
        updated = tf.tensor_scatter_nd_update(plan.slot_scales, slots, tf.gather(new, components))
        self.dynamic_scale.assign(updated[0])
        self._layer_scales.assign(updated[1:])

    def _record_telemetry(self, plan, statistics, weight_grads):
        """Counts overflows per slot; with `estimate_underflow`, the zero shares."""
        slots, components = _slots_of(plan)
        overflowed = tf.gather(tf.cast(statistics.overflow, self.overflow_counts.dtype), components)
        self.overflow_counts.assign_add(
            tf.scatter_nd(slots, overflowed, self.overflow_counts.shape)
        )
        if self.estimate_underflow:
            # Runs on measuring steps only; where nothing was measured, keep the rate.
            current = tf.gather(self.underflow_rates.value, [s[0] for s in slots])
            rates = tf.gather(_statistics.zero_shares(plan, weight_grads), components)
            rates = tf.where(tf.gather(statistics.silent, components), current, rates)
            self.underflow_rates.assign(
                tf.tensor_scatter_nd_update(self.underflow_rates.value, slots, rates)
            )

    def telemetry(self) -> dict:
        """Per-layer numbers for monitoring, as plain Python values.

        Returns:
            A dict with four entries. `"scale"`, `"underflow_rate"` and
            `"overflows"` map each name of `layer_scales()` to a number;
            `"skipped_steps"` is a count. `underflow_rate` is the share of exactly-zero
            values in the gradients of the layer's component (inputs and
            weights): underflow shows as zeros, so it bounds the underflow
            rate from above (true zeros, as of dead ReLU units, count too);
            measured on the steps that measure the scales (see
            `measure_every_n_steps`) once `estimate_underflow` is true (False
            by default; `ScaleMonitor` sets it). `overflows` counts the
            measured steps whose overflow started in the layer's component.

        Example:

        >>> import keras, keras_als
        >>> telemetry = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).telemetry()
        >>> telemetry["scale"], telemetry["overflows"], telemetry["skipped_steps"]
        ({'loss': 32768.0}, {'loss': 0}, 0)
        """
        if not self.built:
            return {
                "scale": self.layer_scales(),
                "underflow_rate": {"loss": 0.0},
                "overflows": {"loss": 0},
                "skipped_steps": 0,
            }
        names = ["loss", *self._scale_names]
        scales = keras.ops.convert_to_numpy(self.slot_scales())
        rates = keras.ops.convert_to_numpy(self.underflow_rates)
        counts = keras.ops.convert_to_numpy(self.overflow_counts)
        return {
            "scale": {n: float(s) for n, s in zip(names, scales)},
            "underflow_rate": {n: float(r) for n, r in zip(names, rates)},
            "overflows": {n: int(c) for n, c in zip(names, counts)},
            "skipped_steps": int(keras.ops.convert_to_numpy(self.skipped_steps)),
        }

    def _apply_if_finite(self, finite, grads, variables):
        """Applies `grads` with the inner optimizer if `finite`, else counts a skipped step.

        The skip branch is not empty on purpose: XLA then compiles the cond
        into selects over the elementwise update, as for Keras's
        LossScaleOptimizer, which runs faster on a CPU than a conditional.
        """

        def apply_step():
            self.inner_optimizer.apply(grads, trainable_variables=variables)

        def skip_step():
            self.skipped_steps.assign_add(1)

        if tf.__internal__.distribute.strategy_supports_no_merge_call():
            keras.ops.cond(finite, apply_step, skip_step)
            return

        # The inner optimizer all-reduces through merge_call, which a cond in
        # replica context cannot contain: decide in cross-replica context.
        def decide(distribution, finite, grads):
            finite = distribution.experimental_local_results(finite)[0]

            def apply_everywhere():
                distribution.extended.call_for_each_replica(
                    lambda g: self.inner_optimizer.apply(g, trainable_variables=variables),
                    args=(grads,),
                )

            keras.ops.cond(finite, apply_everywhere, skip_step)

        tf.distribute.get_replica_context().merge_call(decide, args=(finite, grads))

    def get_config(self):
        config = super().get_config()  # name, inner_optimizer, initial_scale, dynamic_growth_steps
        config["measure_every_n_steps"] = self.measure_every_n_steps
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


def _slots_of(plan) -> tuple[list[list[int]], list[int]]:
    """`([slot], component)` pairs: every slot of `plan`'s components, and whose it is."""
    pairs = [([slot], i) for i, c in enumerate(plan.components) for slot in c.slots()]
    return [p[0] for p in pairs], [p[1] for p in pairs]


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
