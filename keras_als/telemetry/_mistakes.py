"""The mistakes a user can make with the optimizer, caught.

Arguments are checked when the optimizer is made, and what the callbacks,
`diagnose` and `calibrate` are given when they start (`adaptive_optimizer`,
`measurable`); each error names the fix. What goes wrong in training is said
once, as a `UserWarning`:

- `warn_eager`: the step runs eagerly, so there is no graph to plan scales;
- `unscaled_apply`: `apply` traced without `scale_loss` in the same
  function, which divides every gradient by a loss scale never applied (an
  error where `scale_loss` ran in another traced function);
- `warn_no_boundaries`: a model never given to `keras_als.wrap_model`, whose
  layers all share the loss's one scale;
- `warn_bfloat16`: the global policy is mixed_bfloat16, which needs no loss scale;
- `warn_stuck`: the stuck rule of the telemetry fired (skips in a row, or
  too many recent ones), said at the end of `fit` too, monitor or not;
- `warn_needs_float32`: not stuck, but float16 loses whole layers' gradients
  (`telemetry()["needs_float32"]`), said at the end of `fit` too;
- `warn_beyond_float16`: neither, but layers' gradients went beyond float16's
  range (`telemetry()["beyond_float16"]`), their scales since recovered or
  not, said at the end of `fit` too.
"""

from __future__ import annotations

import math
import numbers
import warnings

import keras
import tensorflow as tf

from keras_als import policies
from keras_als.step import _step_record
from keras_als.telemetry import _telemetry


def warn_once(optimizer, kind: str, message: str, stacklevel: int = 3) -> None:
    """Warns `message` unless `optimizer` warned of `kind` already."""
    said = vars(optimizer).setdefault("_keras_als_warned", set())
    if kind not in said:
        said.add(kind)
        warnings.warn(message, UserWarning, stacklevel=stacklevel)


def warn_eager(optimizer) -> None:
    warn_once(
        optimizer,
        "eager",
        "keras_als: the training step runs eagerly (run_eagerly=True or a custom "
        "loop without tf.function), so there is no graph to plan layer-wise "
        "scales; AdaptiveLossScaleOptimizer uses one dynamic loss scale, like "
        "keras.optimizers.LossScaleOptimizer. Trace the step (the default in "
        "model.compile, or @tf.function) for layer-wise scales.",
        stacklevel=4,
    )


def unscaled_apply(optimizer) -> None:
    """Raises if `scale_loss` ran in another traced function than `apply`, else
    warns (once) that `apply` is traced without it."""
    if _step_record.planned_elsewhere(optimizer):
        raise ValueError(
            "apply() is traced in another tf.function than scale_loss(): the gradients "
            "carry per-layer scales that only the function which called scale_loss() "
            "knows. Call scale_loss, tape.gradient and apply in one traced function."
        )
    warn_once(
        optimizer,
        "unscaled_apply",
        "keras_als: apply() was traced without scale_loss() in the same function, so "
        "the gradients are divided by a loss scale (2**15 at first) that the loss never "
        "got: every update is that much too small. In a custom step call "
        "`scaled = optimizer.scale_loss(loss)` inside the tape and take "
        "`tape.gradient(scaled, ...)`, then apply() in the same tf.function.",
        stacklevel=4,
    )


def warn_no_boundaries(optimizer) -> None:
    warn_once(
        optimizer,
        "no_boundaries",
        "keras_als: the traced step has no scale boundary, so every layer shares the "
        "loss's one scale (Keras's dynamic loss scaling). Instrument the model first: "
        "keras_als.wrap_model(model).",
        stacklevel=4,
    )


def warn_bfloat16(optimizer) -> None:
    """Warns (once) that the global policy is mixed_bfloat16, which needs no loss scale."""
    if keras.config.dtype_policy().name == "mixed_bfloat16":
        warn_once(
            optimizer,
            "bfloat16",
            "keras_als: the dtype policy is mixed_bfloat16, whose range is float32's: no "
            "loss scaling is needed. Pass the inner optimizer to compile as it is, without "
            "AdaptiveLossScaleOptimizer (keras_als is for mixed_float16).",
            stacklevel=4,
        )


def warn_stuck(optimizer, message: str | None, stacklevel: int = 3) -> None:
    if message is not None:
        warn_once(optimizer, "stuck", message, stacklevel=stacklevel)


def warn_from_telemetry(optimizer, telemetry: dict, stacklevel: int = 3) -> None:
    """Says (once each) what `telemetry` shows going wrong: a stuck scaling,
    or layers float16 cannot train."""
    warn_stuck(optimizer, telemetry["warning"], stacklevel=stacklevel + 1)
    warn_needs_float32(optimizer, telemetry, stacklevel=stacklevel + 1)
    warn_beyond_float16(optimizer, telemetry, stacklevel=stacklevel + 1)


def warn_needs_float32(optimizer, telemetry: dict, stacklevel: int = 3) -> None:
    """Says once which layers float16 cannot hold (their gradients overflowed
    at scales below 1 and flush at the scale that holds them), when the
    scaling is not stuck (the stuck warning names them itself)."""
    lost = telemetry["needs_float32"]
    if telemetry["warning"] is not None or not lost:
        return
    named = ", ".join(
        f"{name} (scale 2**{round(math.log2(telemetry['scale'][name]))}, "
        f"{telemetry['overflows'][name]} overflows, "
        f"{telemetry['underflow_rate'][name]:.0%} underflow)"
        for name in lost[:8]
    )
    more = f" and {len(lost) - 8} more" if len(lost) > 8 else ""
    warn_once(
        optimizer,
        "needs_float32",
        f"keras_als: float16 loses the gradients of {named}{more}. Their gradients "
        "overflowed float16 at loss scales below 1, and at the scale that holds them their "
        f"gradients flush to zero: those weights do not train. To fix it, {_telemetry.FLOAT32_FIX}",
        stacklevel=stacklevel,
    )


def warn_beyond_float16(optimizer, telemetry: dict, stacklevel: int = 3) -> None:
    """Says once, in one line, which layers' gradients went beyond float16's
    range (their overflows started at scales below 1), where neither the
    stuck warning nor `warn_needs_float32` named layers: the scales may have
    recovered since, but each of those steps was skipped."""
    beyond = telemetry["beyond_float16"]
    if telemetry["warning"] is not None or telemetry["needs_float32"] or not beyond:
        return
    named = ", ".join(f"{name} ({telemetry['overflows'][name]} overflows)" for name in beyond[:8])
    more = f" and {len(beyond) - 8} more" if len(beyond) > 8 else ""
    warn_once(
        optimizer,
        "beyond_float16",
        f"keras_als: the gradients of {named}{more} went beyond float16's range: their "
        "overflows started at loss scales below 1, so their largest gradients exceed 65504. "
        "Each of those steps was skipped, whether the scales recovered since or not, and no "
        f"loss scale holds such gradients without flushing the small ones. To fix it, "
        f"{_telemetry.FLOAT32_FIX}",
        stacklevel=stacklevel,
    )


def build_inside_step(optimizer, trainable_variables) -> None:
    """Builds `optimizer` on its first `apply`, or says why it cannot."""
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
    with keras.name_scope(optimizer.name, caller=optimizer):
        optimizer.build(trainable_variables)
    optimizer.built = True


def inner(inner_optimizer) -> keras.optimizers.Optimizer:
    """`inner_optimizer` (a Keras optimizer, or its name or config as `compile`
    takes one); raises unless it is one that does not scale the loss."""
    if isinstance(inner_optimizer, (str, dict)):
        inner_optimizer = keras.optimizers.get(inner_optimizer)
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
    return inner_optimizer


def adaptive_optimizer(optimizer, adaptive: type, user: str, or_else: str = ""):
    """`optimizer`, if it is an `adaptive`, else a `ValueError` that names the fix.

    Args:
        optimizer: What `user` was given (or found on the model).
        adaptive: `AdaptiveLossScaleOptimizer`, passed by the caller (the
            optimizer imports this module, so this module cannot import it).
        user: Who needs it, as the message starts: `"ScaleMonitor"`.
        or_else: Another fix, said after the first.
    """
    if not isinstance(optimizer, adaptive):
        raise ValueError(
            f"{user} needs a keras_als.AdaptiveLossScaleOptimizer: compile the model with "
            f"optimizer=keras_als.AdaptiveLossScaleOptimizer(...){or_else}; got "
            f"{type(optimizer).__name__}."
        )
    return optimizer


def measurable(model, loss, user: str) -> None:
    """Raises a `ValueError` that names the fix unless `user` (`"keras_als.diagnose"`)
    can run `model` on a batch and take its loss: the model is built, and
    `loss` is given or the model compiled (its own, `model.compute_loss`)."""
    if not model.built:
        raise ValueError(f"{user} needs a built model: call it on a batch first.")
    if loss is None and not getattr(model, "compiled", False):
        raise ValueError(
            f"{user}: pass loss=, or compile the model first so that its own "
            "loss (model.compute_loss) is used."
        )


BASE_ARGUMENTS = ("clipnorm", "global_clipnorm", "clipvalue", "weight_decay", "use_ema")
"""Arguments of the inner optimizer that Keras's LossScaleOptimizer does not apply itself."""


def no_base_arguments(kwargs: dict) -> None:
    """Raises for an argument that belongs to the inner optimizer (Keras 3.10
    and 3.11 accept `clipnorm` on `LossScaleOptimizer` and ignore it)."""
    given = [name for name in BASE_ARGUMENTS if kwargs.get(name) not in (None, False)]
    if given:
        raise ValueError(
            f"{', '.join(given)}: set it on the `inner_optimizer`, which sees the unscaled "
            f"gradients: AdaptiveLossScaleOptimizer(keras.optimizers.Adam({given[0]}=...))."
        )


def count(name: str, value, hint: str = "") -> None:
    """Raises a ValueError unless `value` is a whole number >= 1 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a whole number >= 1{hint}; got {value!r}.")


def power_of_two_at_most(initial_scale) -> float:
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
            "initial_scale must be a finite number between 2**-40 and 2**64, best a power "
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
