"""The optimizer's state per scale, and what a step writes into it.

`make_variables` (called by `AdaptiveLossScaleOptimizer.build`) makes the
optimizer's one variable beyond Keras's, `scale_state` (float32): a table
with one row per kind of state in `PER_SCALE` and one column per scale entry
(entry 0 the loss's, then one per trainable variable, `_entries`), followed by the counters
(`COUNTERS`, then the recent skips window). The loss's scale itself stays in
Keras's `dynamic_scale`. One variable, because every variable a compiled
step updates costs it a fixed time on a CPU, and more there than in a small
function (`python -m benchmarks.real_models --parts breakdown`,
`keras_with_state`). A plan's scale *components* each hold one or more
entries (layers whose weights are tied share a component). These functions
read the state per component and write each component's new value into all
of its entries:

- `choose_scales` (measuring steps): the policy's next scales, with the
  headroom left;
- `record_measurement` (measuring steps): which scales now come from a
  measurement (`MEASURED`); the underflow shares, for the telemetry (the caller `write`s
  the rows of both in one assignment);
- `learn_from_overflow` (skipped steps): back off, headroom, where the
  overflow started;
- `underflow` (measuring steps, for `record_measurement`): the underflow
  shares per component.

`state` below is the optimizer: its variables are the state.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_als import policies
from keras_als.step import _statistics

SKIP_WINDOW = 100
"""Steps over which `telemetry()["recent_skip_rate"]` is taken."""
FLUSH_PROPAGATION = 8
"""Components upstream of a flushed gradient marked as underflowed whole."""

PER_SCALE = (
    "scale",  # each entry's scale (entry 0: the loss's is Keras's dynamic_scale)
    "headroom",  # what overflows taught each scale (policies.Headroom) ...
    "headroom_since",  # ... and since which step
    "flags",  # MEASURED + BEYOND_FLOAT16 (sums of the flags below; 0: none)
    "overflow_counts",  # telemetry: overflows that started there ...
    "last_overflow_step",  # ... and the last one's step (-1: none)
    "underflow_rates",  # telemetry: float16 subnormal share ...
    "zero_rates",  # ... and exact zero share
    "safe_scale",  # the scale of the last measuring step, which was finite (MAX_SCALE: none)
)
"""The rows of the table in `scale_state` (counts and flags are exact integers in it)."""

MEASURED = 1.0
"""Flag: the scale was chosen from a measurement (not: the first guess)."""
BEYOND_FLOAT16 = 2.0
"""Flag: an overflow started there at a scale below 1 (the gradients exceeded
float16's largest value), on any step so far, though the scale recovered
since. Older checkpoints, whose row held the first flag alone, load as they are."""

COUNTERS = (
    "skipped_steps",
    "skipped_in_a_row",
    "steps_since_measured",
    "steps_until_measuring",
)
"""The counters after the table in `scale_state`; the recent skips window
(`SKIP_WINDOW` entries, 1 where that step was skipped) follows them. Float32
counts are exact up to 2**24 (16.7 million skipped steps)."""

_COUNTED = len(COUNTERS) + SKIP_WINDOW


def make_variables(state, variable_count: int) -> None:
    """Makes the optimizer's variables: `scale_state`, with a column for the
    loss's entry and one for each of the `variable_count` trainable variables
    the optimizer is built for, and Keras's `step_counter` and `dynamic_scale`.

    Every replica computes the same new values (from statistics and
    finiteness agreed across replicas), so each replica writes its own copy
    (`aggregation="none"`, as Keras's `LossScaleOptimizer` declares its
    variables): a write needs no `merge_call`, which TensorFlow leaves out
    when XLA compiles the step for several GPUs, and may sit in a branch.
    """

    def variable(name, dtype="float32", initial=state.initial_scale, shape=()):
        return state.add_variable(
            shape=shape,
            dtype=dtype,
            initializer=keras.initializers.Constant(initial),
            aggregation="none",
            name=name,
        )

    first = {
        "scale": float(state.initial_scale),
        "last_overflow_step": -1.0,
        "safe_scale": policies.MAX_SCALE,
    }
    table = [first.get(row, 0.0) for row in PER_SCALE for _ in range(variable_count + 1)]
    initial = table + [0.0] * _COUNTED
    state.scale_state = variable("scale_state", initial=initial, shape=(len(initial),))
    # LossScaleOptimizer's own state, with the aggregation above: the loss's
    # scale, and the growth counter of the one dynamic scale of an eager step.
    state.step_counter = variable("step_counter", "int", 0)
    state.dynamic_scale = variable("dynamic_scale")


def vector(state) -> tf.Tensor:
    """Every scale as one float32 vector: the loss's (entry 0, Keras's
    `dynamic_scale`), then each variable's; before `build`, the initial scale."""
    if not state.built:
        return tf.constant([float(state.initial_scale)])
    loss = tf.reshape(tf.convert_to_tensor(state.dynamic_scale), [1])
    return tf.concat([loss, row(state, "scale")[1:]], axis=0)


def table(state) -> tf.Tensor:
    """The table of `PER_SCALE` rows, one column per scale entry."""
    flat = tf.convert_to_tensor(state.scale_state)
    return tf.reshape(flat[:-_COUNTED], [len(PER_SCALE), -1])


def row(state, name: str) -> tf.Tensor:
    """Row `name` of `PER_SCALE`: its value for every scale entry."""
    return table(state)[PER_SCALE.index(name)]


def counters(state) -> tf.Tensor:
    """The counters of `COUNTERS` and the recent skips window, as float32."""
    return tf.convert_to_tensor(state.scale_state)[-_COUNTED:]


def counter(state, name: str) -> tf.Tensor:
    """The counter `name` of `COUNTERS`, as int32."""
    return tf.cast(counters(state)[COUNTERS.index(name)], tf.int32)


def counter_value(state, name: str) -> int:
    """The counter `name` of `COUNTERS` read on the host in one variable read
    (0 before `build`), for callbacks that check it every batch."""
    if not state.built:
        return 0
    return int(state.scale_state.numpy()[-_COUNTED + COUNTERS.index(name)])


def recent_skips(state) -> tf.Tensor:
    """The recent skips window: 1 where that step (its number modulo `SKIP_WINDOW`) skipped."""
    return counters(state)[len(COUNTERS) :]


def assign(state, new_table=None, new_counters=None) -> None:
    """Writes `new_table` and `new_counters` (either left as it is if None)."""
    flat = tf.convert_to_tensor(state.scale_state)
    new_table = flat[:-_COUNTED] if new_table is None else tf.reshape(new_table, [-1])
    new_counters = flat[-_COUNTED:] if new_counters is None else new_counters
    state.scale_state.assign(tf.concat([new_table, new_counters], axis=0))


def counter_masks(state, step=None) -> dict[str, tf.Tensor]:
    """Boolean masks over the optimizer's counters: one per name in `COUNTERS`,
    and, when `step` is given, `"window"` for this step's entry (`step` modulo
    `SKIP_WINDOW`) of the recent skips window. Made outside the conditional that writes the
    counters (`counters_with`): with these comparisons inside it, XLA kept the
    conditional rather than turning it into selects (`tests/test_optimizer.py`
    reads the optimized HLO)."""
    index = tf.range(_COUNTED)
    masks = {name: index == i for i, name in enumerate(COUNTERS)}
    if step is not None:
        window_index = len(COUNTERS) + tf.cast(step, tf.int32) % SKIP_WINDOW
        masks["window"] = index == window_index
    return masks


def counters_with(state, masks, zero=(), increment=(), values=None) -> tf.Tensor:
    """The optimizer's counters with the given ones changed, elementwise.

    Args:
        state: The optimizer.
        masks: `counter_masks(state, step)`.
        zero: Names in `masks` to set to 0.
        increment: Names in `masks` to add one to.
        values: `{name: new value}` for names in `masks`.

    Returns:
        The new counters, for `assign(state, new_counters=...)`.
    """
    now = counters(state)
    for name in zero:
        now = tf.where(masks[name], tf.zeros_like(now), now)
    for name in increment:
        now = now + tf.cast(masks[name], now.dtype)
    for name, value in (values or {}).items():
        now = tf.where(masks[name], tf.cast(value, now.dtype), now)
    return now


def per_component(plan, values) -> tf.Tensor:
    """Each component's value in a vector with one entry per scale (its own entry's)."""
    return tf.gather(tf.convert_to_tensor(values), [c.entry for c in plan.components])


def write(plan, state, rows: dict) -> None:
    """Writes each component's values into every entry it holds, for each row
    of `rows` (`{name in PER_SCALE: one value per component}`), in one
    assignment of the table; a `"scale"` row also sets the loss's scale,
    which Keras's `dynamic_scale` holds."""
    entries, components = _entries_of(plan)
    indices = [[PER_SCALE.index(name), entry] for name in rows for [entry] in entries]
    values = tf.stack([tf.cast(rows[name], tf.float32) for name in rows])
    updates = tf.reshape(tf.gather(values, components, axis=1), [-1])
    assign(state, new_table=tf.tensor_scatter_nd_update(table(state), indices, updates))
    if "scale" in rows:
        state.dynamic_scale.assign(tf.gather(rows["scale"], plan.loss_component))


def headroom_of(state, plan) -> policies.Headroom:
    """The headroom each component learned from overflows."""
    return policies.Headroom(
        per_component(plan, row(state, "headroom")),
        per_component(plan, row(state, "headroom_since")),
    )


def choose_scales(state, plan, statistics, finite, step, updated) -> tuple[tf.Tensor, dict]:
    """The policy's next scales, with the headroom left at `step`, none of them
    raised before the first update (`policies.rise_after_first_update`).

    Returns the policy's proposal and the rows to `write` (the new scales, and
    this step's as the last that was safe)."""
    headroom = policies.headroom_at(headroom_of(state, plan), step)
    proposed = policies.next_scale(state.policy, statistics, plan.scales, headroom)
    new = policies.rise_after_first_update(proposed, plan.scales, updated)
    safe = plan.scales
    if _statistics.several_replicas():  # this runs on skipped steps too
        new = tf.where(finite, new, per_component(plan, vector(state)))
        safe = tf.where(finite, safe, per_component(plan, row(state, "safe_scale")))
    return proposed, {"safe_scale": safe, "scale": new}


def record_measurement(state, plan, statistics, gradients) -> dict:
    """The rows to `write`: which scales now come from a measurement, and the
    underflow (telemetry)."""
    informed = tf.logical_and(tf.math.is_finite(statistics.amax), tf.logical_not(statistics.silent))
    was = per_component(plan, row(state, "flags"))
    rows = {"flags": tf.where(informed, was - has_flag(was, MEASURED) + MEASURED, was)}
    if not state.estimate_underflow:
        # Without the counts, only the whole losses: 1 where every gradient
        # of the component flushed to zero at its scale, 0 elsewhere.
        lost, silent = whole_losses(plan, statistics)
        before = per_component(plan, row(state, "underflow_rates"))
        return {**rows, "underflow_rates": tf.where(silent, before, tf.cast(lost, before.dtype))}
    subnormal, zero = underflow(
        plan,
        statistics,
        gradients.weight_grads,
        gradients.float16,
        before=(
            per_component(plan, row(state, "underflow_rates")),
            per_component(plan, row(state, "zero_rates")),
        ),
    )
    return {**rows, "underflow_rates": subnormal, "zero_rates": zero}


def learn_from_overflow(state, plan, reached, step) -> None:
    """On a skipped step: every component the overflow reached backs off, by
    `BACKOFF` and at least to the scale of its last measuring step (finite),
    so a scale that the last measurement raised far returns at once to one
    that held (`policies.back_off`); where the overflow started
    (`policies.overflow_origins`) the measured scales gain headroom and the other
    measured ones rise to at least one step of it (`policies.after_overflow`);
    telemetry notes the origin, and flags `BEYOND_FLOAT16` where its scale
    was below 1."""
    safe = per_component(plan, row(state, "safe_scale"))
    scales = tf.where(reached, policies.back_off(plan.scales, safe), plan.scales)
    origin = policies.overflow_origins(reached, plan.downstream())
    flags = per_component(plan, row(state, "flags"))
    measured = has_flag(flags, MEASURED) > 0
    headroom = policies.after_overflow(
        headroom_of(state, plan),
        reached=tf.logical_and(reached, measured),
        origin=tf.logical_and(origin, measured),
        step=step,
        measured=measured,
    )
    counts = per_component(plan, row(state, "overflow_counts"))
    last = per_component(plan, row(state, "last_overflow_step"))
    below_one = tf.logical_and(origin, plan.scales < 1.0)
    beyond = tf.cast(tf.logical_and(below_one, has_flag(flags, BEYOND_FLOAT16) == 0), flags.dtype)
    rows = {
        "scale": scales,
        "flags": flags + BEYOND_FLOAT16 * beyond,
        "headroom": headroom.binades,
        "headroom_since": headroom.since,
        "overflow_counts": counts + tf.cast(origin, counts.dtype),
        "last_overflow_step": tf.where(origin, tf.fill(tf.shape(last), step), last),
    }
    write(plan, state, rows)


def has_flag(flags, flag: float):
    """`flag` where `flags` (values of the `"flags"` row) hold it, else 0."""
    return flag * (tf.math.floormod(tf.math.floor(flags / flag), 2.0))


def _entries_of(plan) -> tuple[list[list[int]], list[int]]:
    """`([entry], component)` pairs: every entry of `plan`'s components, and whose it is."""
    pairs = [([entry], i) for i, c in enumerate(plan.components) for entry in c.entries()]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def underflow(plan, statistics, weight_grads, float16, before) -> tuple[tf.Tensor, tf.Tensor]:
    """Per component, the shares of float16 subnormals and of exact zeros.

    Where a component's gradients were lost whole (`whole_losses`), its
    underflow share is 1. Where nothing reached a component, its shares stay
    as they were (`before`, a pair of vectors).
    """
    shares = tf.stack(_statistics.underflow_shares(plan, weight_grads, float16))
    subnormal, zero = tf.unstack(_statistics.mean_over_replicas(shares))
    lost, silent = whole_losses(plan, statistics)
    subnormal = tf.where(lost, tf.ones_like(subnormal), subnormal)
    return tf.where(silent, before[0], subnormal), tf.where(silent, before[1], zero)


def whole_losses(plan, statistics) -> tuple[tf.Tensor, tf.Tensor]:
    """`(lost, silent)` per component: where its gradients underflowed whole,
    and where nothing reached it (so this step says nothing about it).

    A gradient that rounded to zero whole at a boundary, or a component whose
    every gradient is zero though gradient reached it, underflowed whole (or
    its units are all dead), and so did the components upstream that
    received nothing (silent), up to `FLUSH_PROPAGATION` components away.
    """
    n = len(plan.components)
    silent = statistics.silent
    if silent is None:
        silent = tf.zeros([n], tf.bool)
    lost = tf.logical_and(tf.equal(statistics.amax, 0.0), tf.logical_not(silent))
    if statistics.flushed is not None:
        lost = tf.logical_or(statistics.flushed, lost)
    downstream = plan.downstream_matrix()
    for _ in range(FLUSH_PROPAGATION):
        below = tf.linalg.matvec(downstream, tf.cast(lost, tf.float32)) > 0
        lost = tf.logical_or(lost, tf.logical_and(silent, below))
    return lost, tf.logical_and(silent, tf.logical_not(lost))
