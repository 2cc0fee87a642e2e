"""`ScaleState`: everything of the optimizer that a traced step reads and writes.

`AdaptiveLossScaleOptimizer` holds one `ScaleState` (its `scaling`) and
hands it, never itself, to the step's functions (`_apply_phases`, `_skip`,
`_scale_state`) and to the telemetry (`_telemetry`): the settings they read
(the policy, the measuring period, the initial scale, whether to count
underflow), the inner optimizer that applies the updates and owns Keras's
`iterations`, the variables the state is built for, and keras_als's own
variables, made by `ScaleState.build` through the optimizer's `add_variable`
(so Keras tracks and saves them, under the optimizer's attributes of the same
names).

The layout of `scale_state`, the one variable beyond Keras's (float32): a
table with one row per kind of state in `PER_SCALE` and one column per scale
entry (entry 0 the loss's, then one per trainable variable, `_entries`),
then the counters (`COUNTERS`, then the recent skips window). The loss's
scale itself stays in Keras's `dynamic_scale`. One variable, because every
variable a compiled step updates costs it a fixed time on a CPU
(`python -m benchmarks.real_models --parts breakdown`, `keras_with_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras
import tensorflow as tf

from keras_als import policies
from keras_als.step import _indices

SKIP_WINDOW = 100
"""Steps over which `telemetry()["recent_skip_rate"]` is taken."""

PER_SCALE = (
    "scale",  # each entry's scale (entry 0: the loss's is Keras's dynamic_scale)
    "headroom",  # what overflows taught each scale (policies.Headroom) ...
    "headroom_since",  # ... and since which step
    "flags",  # MEASURED + BEYOND_FLOAT16 (sums of the flags of _scale_state; 0: none)
    "overflow_counts",  # telemetry: overflows that started there ...
    "last_overflow_step",  # ... and the last one's step (-1: none)
    "underflow_rates",  # telemetry: float16 subnormal share ...
    "zero_rates",  # ... and exact zero share
    "safe_scale",  # the scale of the last measuring step, which was finite (MAX_SCALE: none)
)
"""The rows of the table in `scale_state` (counts and flags are exact integers in it)."""

COUNTERS = (
    "skipped_steps",
    "skipped_in_a_row",
    "steps_since_measured",
    "steps_until_measuring",
)
"""The counters after the table in `scale_state`; the recent skips window
(`SKIP_WINDOW` entries, 1 where that step was skipped) follows them. Float32
counts are exact up to 2**24 (16.7 million skipped steps)."""

COUNTED = len(COUNTERS) + SKIP_WINDOW
"""Entries at the end of `scale_state` after the table: the counters and the window."""


class Setting:
    """An attribute of the optimizer that is its `scaling`'s field of the same
    name: `optimizer.estimate_underflow = True` sets what the step reads."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        return self if instance is None else getattr(instance.scaling, self.name)

    def __set__(self, instance, value) -> None:
        setattr(instance.scaling, self.name, value)


class ScaleState:
    """What a traced step of `AdaptiveLossScaleOptimizer` reads and writes.

    Args:
        inner_optimizer: The optimizer that applies the updates; its
            `iterations` counts the applied steps.
        initial_scale: Every scale before the first measurement (a power of two).
        policy: The `keras_als.policies` policy that chooses the scales.
        measure_every_n_steps: The longest period between measuring steps.
        warn_after_skipped_steps: Skipped steps in a row that make the scaling stuck.
        estimate_underflow: Whether measuring steps count zeros and subnormals.
    """

    __slots__ = (
        "inner_optimizer",
        "initial_scale",
        "policy",
        "measure_every_n_steps",
        "warn_after_skipped_steps",
        "estimate_underflow",
        "trainable_variables",  # the variables the state has a column for, after `build`
        "scale_state",  # the variable of the table and counters (None before `build`) ...
        "step_counter",  # ... Keras's growth counter of an eager step's one scale ...
        "dynamic_scale",  # ... and Keras's one scale: the loss's
        "indices",  # runtime indices of the scale entries (`_indices`), after `build`
    )

    def __init__(
        self,
        inner_optimizer,
        initial_scale: float,
        *,
        policy: policies.Policy,
        measure_every_n_steps: int,
        warn_after_skipped_steps: int,
        estimate_underflow: bool,
    ):
        self.inner_optimizer = inner_optimizer
        self.initial_scale = initial_scale
        self.policy = policy
        self.measure_every_n_steps = measure_every_n_steps
        self.warn_after_skipped_steps = warn_after_skipped_steps
        self.estimate_underflow = estimate_underflow
        self.trainable_variables: tuple = ()
        self.scale_state = self.step_counter = self.dynamic_scale = None
        self.indices: tuple = ()

    @property
    def built(self) -> bool:
        """Whether `build` made the variables."""
        return self.scale_state is not None

    @property
    def iterations(self):
        """Keras's count of applied steps: the inner optimizer's."""
        return self.inner_optimizer.iterations

    @property
    def skipped_steps(self) -> tf.Tensor:
        """Steps skipped so far, as int32."""
        return self.counter("skipped_steps")

    def build(self, add_variable: Callable, trainable_variables: Sequence) -> tuple:
        """Makes the variables, through the optimizer's `add_variable`:
        `scale_state`, with a column for the loss's entry and one for each of
        `trainable_variables`, and Keras's `step_counter` and `dynamic_scale`.

        Every replica computes the same new values (from statistics and
        finiteness agreed across replicas), so each replica writes its own copy
        (`aggregation="none"`, as Keras's `LossScaleOptimizer` declares its
        variables): a write needs no `merge_call`, which TensorFlow leaves out
        when XLA compiles the step for several GPUs, and may sit in a branch.

        Returns:
            `(scale_state, step_counter, dynamic_scale)`, in the order they
            were made (the order of `optimizer.variables`, which checkpoints
            and `.keras` files keep), for the optimizer to hold under those names.
        """

        def variable(name, dtype="float32", initial=self.initial_scale, shape=()):
            return add_variable(
                shape=shape,
                dtype=dtype,
                initializer=keras.initializers.Constant(initial),
                aggregation="none",
                name=name,
            )

        first = {
            "scale": float(self.initial_scale),
            "last_overflow_step": -1.0,
            "safe_scale": policies.MAX_SCALE,
        }
        columns = len(trainable_variables) + 1
        initial = [first.get(row, 0.0) for row in PER_SCALE for _ in range(columns)]
        initial += [0.0] * COUNTED
        self.trainable_variables = tuple(trainable_variables)
        self.scale_state = variable("scale_state", initial=initial, shape=(len(initial),))
        # LossScaleOptimizer's own state, with the aggregation above: the loss's
        # scale, and the growth counter of the one dynamic scale of an eager step.
        self.step_counter = variable("step_counter", "int", 0)
        self.dynamic_scale = variable("dynamic_scale")
        self.indices = _indices.make(columns)
        return self.scale_state, self.step_counter, self.dynamic_scale

    def vector(self) -> tf.Tensor:
        """Every scale as one float32 vector: the loss's (entry 0, Keras's
        `dynamic_scale`), then each variable's; before `build`, the initial scale."""
        if not self.built:
            return tf.constant([float(self.initial_scale)])
        loss = tf.reshape(tf.convert_to_tensor(self.dynamic_scale), [1])
        return tf.concat([loss, self.row("scale")[1:]], axis=0)

    def table(self) -> tf.Tensor:
        """The table of `PER_SCALE` rows, one column per scale entry."""
        flat = tf.convert_to_tensor(self.scale_state)
        return tf.reshape(flat[:-COUNTED], [len(PER_SCALE), -1])

    def row(self, name: str) -> tf.Tensor:
        """Row `name` of `PER_SCALE`: its value for every scale entry."""
        return self.table()[PER_SCALE.index(name)]

    def counters(self) -> tf.Tensor:
        """The counters of `COUNTERS` and the recent skips window, as float32."""
        return tf.convert_to_tensor(self.scale_state)[-COUNTED:]

    def counter(self, name: str) -> tf.Tensor:
        """The counter `name` of `COUNTERS`, as int32."""
        return tf.cast(self.counters()[COUNTERS.index(name)], tf.int32)

    def counter_value(self, name: str) -> int:
        """The counter `name` of `COUNTERS` read on the host in one variable read
        (0 before `build`), for callbacks that check it every batch."""
        if not self.built:
            return 0
        return int(self.scale_state.numpy()[-COUNTED + COUNTERS.index(name)])

    def recent_skips(self) -> tf.Tensor:
        """The recent skips window: 1 where that step (its number modulo `SKIP_WINDOW`) skipped."""
        return self.counters()[len(COUNTERS) :]

    def assign(self, new_table=None, new_counters=None) -> None:
        """Writes `new_table` and `new_counters` (either left as it is if None)."""
        flat = tf.convert_to_tensor(self.scale_state)
        new_table = flat[:-COUNTED] if new_table is None else tf.reshape(new_table, [-1])
        new_counters = flat[-COUNTED:] if new_counters is None else new_counters
        self.scale_state.assign(tf.concat([new_table, new_counters], axis=0))

    @staticmethod
    def counter_masks(step=None) -> dict[str, tf.Tensor]:
        """Boolean masks over the counters: one per name in `COUNTERS`, and,
        when `step` is given, `"window"` for this step's entry (`step` modulo
        `SKIP_WINDOW`) of the recent skips window. Made outside the conditional
        that writes the counters (`counters_with`): with these comparisons
        inside it, XLA kept the conditional rather than turning it into
        selects (`tests/test_optimizer.py` reads the optimized HLO)."""
        index = tf.range(COUNTED)
        masks = {name: index == i for i, name in enumerate(COUNTERS)}
        if step is not None:
            window_index = len(COUNTERS) + tf.cast(step, tf.int32) % SKIP_WINDOW
            masks["window"] = index == window_index
        return masks

    def counters_with(self, masks, zero=(), increment=(), values=None) -> tf.Tensor:
        """The counters with the given ones changed, elementwise.

        Args:
            masks: `counter_masks(step)`.
            zero: Names in `masks` to set to 0.
            increment: Names in `masks` to add one to.
            values: `{name: new value}` for names in `masks`.

        Returns:
            The new counters, for `assign(new_counters=...)`.
        """
        now = self.counters()
        for name in zero:
            now = tf.where(masks[name], tf.zeros_like(now), now)
        for name in increment:
            now = now + tf.cast(masks[name], now.dtype)
        for name, value in (values or {}).items():
            now = tf.where(masks[name], tf.cast(value, now.dtype), now)
        return now
