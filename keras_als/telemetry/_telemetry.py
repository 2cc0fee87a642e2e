"""Telemetry: what the optimizer's state says about the scaling, as plain values.

`read` turns `AdaptiveLossScaleOptimizer`'s state (its `_state.ScaleState`) into the dict that
`telemetry()` returns (`layer_scales` into `layer_scales()`'s), `stuck`
says why the scaling looks stuck (or None: where the loss itself was not
finite on most skipped steps, it names the float32 tools), `beyond_float16`
which layers' gradients exceed float16's range and `needs_float32` which of
those float16 also loses at their scale. Reading telemetry never changes training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import keras

from keras_als import policies
from keras_als.step import _entries, _scale_state
from keras_als.step._skip import SKIPPED_LOSS_NOT_FINITE
from keras_als.step._state import SKIP_WINDOW

STUCK_SHARE = 0.25
"""Share of the last `SKIP_WINDOW` steps skipped above which the scaling is reported stuck."""


def read(state) -> dict:
    """`optimizer.telemetry()`'s dict (see there) from the optimizer's
    `_state.ScaleState`, without warning."""
    built = state.built
    names, entries = _entries.named(state)

    def per_layer(name, kind, default):
        if not built:
            return {"loss": default}
        values = keras.ops.convert_to_numpy(state.row(name))
        return {n: kind(values[e]) for n, e in zip(names, entries)}

    steps = skipped = in_a_row = loss_not_finite = 0
    recent = 0.0
    if built:
        skipped = int(keras.ops.convert_to_numpy(state.skipped_steps))
        steps = int(keras.ops.convert_to_numpy(state.iterations)) + skipped
        window = keras.ops.convert_to_numpy(state.recent_skips())
        recent = float((window > 0).sum()) / max(1, min(steps, SKIP_WINDOW))
        loss_not_finite = int((window == SKIPPED_LOSS_NOT_FINITE).sum())
        in_a_row = int(keras.ops.convert_to_numpy(state.counter("skipped_in_a_row")))
    telemetry = {
        "scale": layer_scales(state),
        "headroom": per_layer("headroom", float, 0.0),
        "underflow_rate": per_layer("underflow_rates", float, 0.0),
        "zero_rate": per_layer("zero_rates", float, 0.0),
        "overflows": per_layer("overflow_counts", int, 0),
        "last_overflow_step": per_layer("last_overflow_step", int, -1),
        "skipped_steps": skipped,
        "recent_skip_rate": recent,
        "skipped_in_a_row": in_a_row,
        "loss_not_finite": loss_not_finite,
        "steps": steps,
    }
    flags = per_layer("flags", float, 0.0)
    flagged = [n for n, f in flags.items() if int(f) & int(_scale_state.BEYOND_FLOAT16)]
    telemetry["beyond_float16"] = beyond_float16(telemetry, flagged)
    in_float32 = [
        name for owner, _, name in _entries.scaled(state) if owner.layer.compute_dtype == "float32"
    ]
    telemetry["needs_float32"] = needs_float32(telemetry, in_float32)
    telemetry["warning"] = stuck(telemetry, state.warn_after_skipped_steps)
    return telemetry


def layer_scales(state) -> dict[str, float]:
    """`optimizer.layer_scales()` from its `_state.ScaleState`: the scale of
    `"loss"` and of each owner, by name."""
    if not state.built:
        return {"loss": float(state.initial_scale)}
    values = keras.ops.convert_to_numpy(state.vector())
    names, entries = _entries.named(state)
    return {name: float(values[entry]) for name, entry in zip(names, entries)}


def beyond_float16(telemetry: dict, flagged: Sequence[str] = ()) -> list[str]:
    """The layers whose overflows started at a scale below 1: their true
    gradients exceed float16's largest value (65504), so no loss scale holds
    them without flushing their small ones; float32 for the layer does.

    Those whose scale is below 1 now and overflowed, and those of `flagged`
    (the optimizer flags an overflow that started at a scale below 1, so a
    layer stays named after its scale recovered)."""
    return [
        name
        for name, scale in telemetry["scale"].items()
        if name != "loss"
        and (name in flagged or (scale < 1.0 and telemetry["overflows"].get(name, 0) > 0))
    ]


LOST_SHARE = 0.5
"""Underflow share at which `needs_float32` counts a layer's gradients as lost."""


def needs_float32(telemetry: dict, in_float32: Sequence[str] = ()) -> list[str]:
    """The layers beyond float16 (`beyond_float16`) whose gradients also
    underflow at the scale that holds their largest: at least `LOST_SHARE` of
    them on the last measuring step (with `estimate_underflow` off: all of
    them flushed to zero). No loss scale keeps both ends, so float16 loses
    those layers' gradients; float32 for them keeps both. Layers of
    `in_float32` (computing in float32 already) are left out: float32 for
    them is no fix (what overflows is the float16 gradient flowing into them)."""
    rates = telemetry["underflow_rate"]
    return [
        n
        for n in telemetry["beyond_float16"]
        if rates.get(n, 0.0) >= LOST_SHARE and n not in in_float32
    ]


_FLOOR = round(math.log2(policies.MIN_SCALE))

FLOAT32_FIX = (
    'compute those layers in float32 (layer.dtype_policy = "float32", then compile again); '
    "keras_als.diagnose(model, x, y) measures which layers need it on a batch, and its "
    "apply(model) sets them; in fit, the callback keras_als.Float32Fallback(x, y) does both "
    "when this happens."
)
"""The fix both warnings that name layers beyond float16 give."""


def stuck(telemetry: dict, in_a_row_limit: int) -> str | None:
    """Why the scaling looks stuck, from `telemetry()`'s numbers, or None."""
    in_a_row = telemetry["skipped_in_a_row"]
    share = telemetry["recent_skip_rate"]
    many = telemetry["steps"] >= SKIP_WINDOW and share >= STUCK_SHARE
    if in_a_row < in_a_row_limit and not many:
        return None
    floor = [n for n, s in telemetry["scale"].items() if s <= policies.MIN_SCALE]
    recent = sorted(
        (
            n
            for n, s in telemetry["last_overflow_step"].items()
            if s >= 0 and s >= telemetry["steps"] - SKIP_WINDOW
        ),
        key=lambda n: -telemetry["last_overflow_step"][n],
    )
    since = telemetry["steps"] - in_a_row
    what = (
        f"the last {in_a_row} steps were all skipped (since step {since})"
        if in_a_row >= in_a_row_limit
        else f"{share:.0%} of the last {SKIP_WINDOW} steps were skipped"
    )
    where = f"; overflows started in: {', '.join(recent[:8])}" if recent else ""
    at_floor = f"; scales at their floor (2**{_FLOOR}): {', '.join(floor[:8])}" if floor else ""
    beyond = telemetry.get("beyond_float16") or []
    fix = (
        f" Gradients beyond float16's range (they overflowed at scales below 1) in: "
        f"{', '.join(beyond[:8])}. No loss scale holds them: {FLOAT32_FIX}"
        if beyond
        else ""
    )
    start = f"keras_als: loss scaling looks stuck: {what}{where}{at_floor}.{fix}"
    if _mostly_loss_not_finite(telemetry):
        return f"{start} {_loss_not_finite(telemetry)}"
    return (
        f"{start} Skipped steps change no weight. The usual causes: NaN or Inf in the input "
        "data or labels, a loss that is already not finite in float32, or a learning rate "
        "that makes training diverge. Check the data (tf.debugging.check_numerics), train a "
        "few steps in float32, or lower the learning rate."
    )


def _mostly_loss_not_finite(telemetry: dict) -> bool:
    """Whether the loss itself was not finite on half or more of the skipped
    steps of the last `SKIP_WINDOW`."""
    skipped = round(telemetry["recent_skip_rate"] * min(telemetry["steps"], SKIP_WINDOW))
    losses = telemetry.get("loss_not_finite", 0)
    return losses > 0 and 2 * losses >= skipped


FORWARD_FIX = (
    "if the model trains in float32, a layer whose float16 forward pass is not finite (a mask "
    "of -1e9 is -inf in float16, and 0 * -inf is NaN): keras_als.diagnose(model, x, y) names "
    "those layers on a batch and its apply(model) computes them in float32; in fit, the "
    "callback keras_als.Float32Fallback(x, y) does both before the first step."
)
"""The fix the stuck warning gives where the loss itself was not finite."""


def _loss_not_finite(telemetry: dict) -> str:
    window = min(telemetry["steps"], SKIP_WINDOW)
    return (
        f"The loss itself was not finite on {telemetry['loss_not_finite']} of the last "
        f"{window} steps: the forward pass, not the gradients, and no loss scale changes a "
        "forward pass. Skipped steps change no weight. The causes: NaN or Inf in the input "
        "data or labels (check them with tf.debugging.check_numerics); a loss not finite in "
        "float32 too, or a learning rate that makes training diverge (train a few steps in "
        f"float32); or, {FORWARD_FIX}"
    )


def table(telemetry: dict) -> str:
    """`telemetry` as a text table: a line per scale, then the skipped steps."""
    rows = [("scale", "value", "headroom", "overflows")]
    for name, scale in telemetry["scale"].items():
        value = f"2**{int(math.log2(scale))}" if scale > 0 else str(scale)
        headroom = telemetry["headroom"].get(name, 0.0)
        rows.append((name, value, f"{headroom:g}", str(telemetry["overflows"].get(name, 0))))
    widths = [max(len(row[i]) for row in rows) + 2 for i in range(3)]
    lines = ["".join(c.ljust(w) for c, w in zip(row, widths)) + row[3] for row in rows]
    lines.append(f"skipped steps: {telemetry['skipped_steps']} of {telemetry['steps']}")
    if telemetry["warning"]:
        lines.append(telemetry["warning"])
    return "\n".join(lines)
