"""`diagnose`: which layers float16 cannot hold, measured on one batch, and the fix.

A loss scale moves a layer's gradients up or down float16's range, but it
cannot widen it. Two things no scale fixes:

- a layer whose gradients span more than float16 holds: at the largest
  power of two that keeps its largest gradient below 65504, many of its
  small gradients fall below 2**-24 and flush to zero (a LayerNorm over a
  token whose values are all equal, a patch of flat background, divides by
  sqrt(epsilon) and sends gradients of 1e10 and more back to the layers
  before it, whose other gradients are ordinary);
- a layer whose forward output is not finite in float16 although its
  inputs are (a mask of -1e9 is -inf in float16, and 0 * -inf is NaN).

A layer's gradients count those flowing into its inputs: Keras casts a
float16 layer's inputs to float16 as they enter, so a Swin block, which owns
no weights, takes its residual stream, and the gradients of 1e10 flowing back
into it, through float16 although every layer inside it computes in float32.

`diagnose` measures both on one batch, names the layers, and `apply` computes
them in float32 (`layer.dtype_policy = "float32"`), the fix Keras's mixed
precision guide gives for a layer that needs float32.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_als import instrument
from keras_als._keras_private import own_weights
from keras_als.float32 import _forward_checks as forward
from keras_als.policies._policy_terms import FLOAT16_MAX, FLOAT16_TINY
from keras_als.telemetry import _mistakes

UNDERFLOW_LIMIT = 0.01
"""Share of a layer's non-zero gradients that may flush to zero at the largest
scale that holds its largest one before the layer is said to need float32."""


@dataclasses.dataclass(frozen=True)
class Finding:
    """One layer float16 cannot hold.

    Attributes:
        layer: The layer's path inside the model (`layer.path`, less the
            model's own name where it starts with it).
        reason: `"forward"` (its output is not finite in float16, its inputs
            are), `"input"` (its input, finite, is not once cast to float16),
            `"range"` (its gradients span more than float16 holds),
            `"input_range"` (the gradients into its input do: Keras casts a
            float16 layer's inputs to float16 as they enter, so that gradient
            passes through float16 even where the layers around it compute in
            float32; a Swin block takes its residual stream so),
            `"mixed"` (its own operations combine a float32 layer's output
            with float16 tensors once the others are in float32: a Swin
            block's attention adds its float16 mask to the scores of a
            float32 projection), `"raises"` (its float16 call raises
            and its float32 call does not: a float32 constant combined with
            a float16 tensor inside it) or `"overflows"` (in training, not
            on the diagnosed batch: overflows started in its gradients on
            `overflows` steps close together although its scale backed off
            after each, as `Float32Fallback` watches: gradients tiny on most
            batches and far beyond them on a few, as a LayerNorm's over
            near-constant inputs are).
        largest: The largest magnitude of its float32 gradients (`"range"`,
            `"input_range"`: of those into its input).
        underflow_share: The share of its non-zero float32 gradients that
            flush to zero in float16 at the largest power-of-two scale at
            which the largest does not overflow (`"range"`, `"input_range"`).
        error: The error's type and the first line of its text (`"raises"`).
        overflows: The steps on which its overflows started (`"overflows"`).
    """

    layer: str
    reason: str
    largest: float = math.nan
    underflow_share: float = math.nan
    error: str = ""
    overflows: tuple[int, ...] = ()

    def __str__(self) -> str:
        if self.reason == "forward":
            return f"{self.layer}: its float16 output is not finite (its inputs are)"
        if self.reason == "input":
            return f"{self.layer}: its input overflows float16 when cast to it (its compute dtype)"
        if self.reason == "overflows":
            steps = ", ".join(str(step) for step in self.overflows)
            return (
                f"{self.layer}: overflows started in its gradients on steps {steps}, "
                "its scale backed off after each"
            )
        if self.reason == "raises":
            return f"{self.layer}: its float16 call raises (in float32 it runs): {self.error}"
        if self.reason == "mixed":
            return (
                f"{self.layer}: combines a float32 layer's output with float16 tensors "
                "(in float32 with it)"
            )
        which = "the gradients into its input" if self.reason == "input_range" else "gradients"
        return (
            f"{self.layer}: {which} up to {self.largest:.1e}; at the largest scale that "
            f"holds them, {self.underflow_share:.0%} of the non-zero ones flush to zero"
        )


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    """What `diagnose` found: the layers that need float32, and why.

    Attributes:
        findings: One `Finding` per layer, in the order the model calls them.

    Example:

    >>> import keras, keras_als
    >>> found = keras_als.Diagnosis((keras_als.float32.diagnosis.Finding("dense", "forward"),))
    >>> found.layers
    ['dense']
    >>> print(found)  # doctest: +ELLIPSIS
    keras_als.diagnose: 1 layer(s) need float32:
      dense: its float16 output is not finite (its inputs are)
    Fix: layer.dtype_policy = "float32" for each (diagnosis.apply(model) does it), ...
    """

    findings: tuple[Finding, ...]

    @property
    def layers(self) -> list[str]:
        """The paths of the layers that need float32."""
        return [f.layer for f in self.findings]

    def apply(self, model: keras.Model) -> keras.Model:
        """Computes the named layers of `model` (and the layers inside them) in
        float32, in place, and returns `model`. Retrace after it: compile the
        model again, or call a new `tf.function`."""
        forward.to_float32(forward.layers_by_path(model, self.layers))
        instrument.retrace(model)
        return model

    def __str__(self) -> str:
        if not self.findings:
            return "keras_als.diagnose: float16 holds every layer on this batch."
        lines = [f"keras_als.diagnose: {len(self.findings)} layer(s) need float32:"]
        lines += [f"  {finding}" for finding in self.findings]
        lines.append(
            'Fix: layer.dtype_policy = "float32" for each (diagnosis.apply(model) does it), '
            "then compile again."
        )
        return "\n".join(lines)


def diagnose(
    model: keras.Model,
    x,
    y=None,
    loss: Callable | None = None,
) -> Diagnosis:
    """Finds the layers of `model` that float16 cannot hold, on one batch.

    Runs `model` on `(x, y)` eagerly, in training mode: as it is (under
    `mixed_float16`) to find layers whose output is not finite while their
    inputs are, or whose call raises (a dtype mismatch inside it) where it
    does not in float32 (again with those in float32, until none is left;
    an error that float32 raises too is raised as the model raises it);
    then the forward pass is traced, not run, in a `tf.function`, as `fit`
    traces it, for a float16 operation with no kernel in a graph (`tf.range`
    in float16); then with
    every layer computing in float32 (their policies are restored after) to
    measure each layer's gradients: its weights' and its outputs', and
    those into its inputs (where the trainable weights reach them). A layer
    needs float32 when more than `UNDERFLOW_LIMIT` of either's non-zero
    gradients flush to zero at the largest power of two that holds their
    largest. Where
    some float16 output is not finite, those layers are reported alone
    (gradients through a NaN say nothing): apply the diagnosis and call
    `diagnose` again. Last, the forward pass runs with the layers found in
    float32, and a layer whose call then fails to combine their float32
    output with its own float16 tensors is named too. Weights (moving
    statistics and seed generators' states too), metrics, optimizer and
    policies are left as they were.

    Args:
        model: A built model, wrapped by `wrap_model` or not.
        x: One batch of inputs, as `model` takes them.
        y: Its targets.
        loss: `loss(y, y_pred)`, a scalar. None: the model's own
            (`model.compute_loss`, as `fit` uses; the model must be compiled).

    Returns:
        A `Diagnosis`: `print` it, or `apply` it to compute the named layers
        in float32.

    Example:

    >>> import keras, keras_als, numpy as np
    >>> keras.config.set_dtype_policy("mixed_float16")
    >>> model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    >>> diagnosis = keras_als.diagnose(
    ...     model, np.ones((8, 4), "float32"), np.zeros((8, 2), "float32"),
    ...     loss=keras.losses.MeanSquaredError())
    >>> diagnosis.layers
    []
    >>> keras.config.set_dtype_policy("float32")
    """
    return diagnosed_with(model, x, y, loss)


def diagnosed_with(
    model: keras.Model, x, y=None, loss: Callable | None = None, also: Sequence[Finding] = ()
) -> Diagnosis:
    """`diagnose(model, x, y, loss)`, with the findings of `also` whose layers
    it does not name (`Float32Fallback`'s, from training) among those whose
    mixing layers its last check finds."""
    _mistakes.measurable(model, loss, "keras_als.diagnose")
    x = tf.nest.map_structure(tf.convert_to_tensor, x)
    with forward.state_kept(model):
        not_finite = forward.forward_not_finite(model, x)
        if not_finite:
            findings = [Finding(path, reason, error=error) for path, reason, error in not_finite]
        else:
            findings = _range_findings(model, x, y, loss)
        named = {f.layer for f in findings}
        findings += [f for f in also if f.layer not in named]
        mixed = forward.mixing_layers(model, x, [f.layer for f in findings])
        return Diagnosis(tuple(findings + [Finding(path, "mixed") for path in mixed]))


def _range_findings(model, x, y, loss) -> list[Finding]:
    calls = {}  # id(layer): (layer, outputs of a layer with own weights, inputs)
    computed = {}  # id(tensor): tensor, for the tensors the trainable weights reach

    def record(layer, args, kwargs, result):
        inputs = [t for t in forward.floats((args, kwargs)) if id(t) in computed]
        outputs = forward.floats(result)
        if inputs or layer.trainable_weights:
            computed.update((id(t), t) for t in outputs)
        own = any(w.trainable for w in own_weights(layer))
        if own or inputs:
            _, own_outputs, own_inputs = calls.setdefault(id(layer), (layer, [], []))
            own_outputs.extend(outputs if own else [])
            own_inputs.extend(inputs)

    with forward.policies_kept(model):
        forward.to_float32([model])
        variables = model.trainable_variables
        with tf.GradientTape() as tape, forward.recording_calls(model, record):
            y_pred = model(x, training=True)
            value = forward.loss_of(model, x, y, y_pred, loss)
        watched = [t for _, outputs, inputs in calls.values() for t in outputs + inputs]
        grads = tape.gradient(value, variables + watched)
    by_variable = {id(v): g for v, g in zip(variables, grads[: len(variables)])}
    by_tensor = iter(grads[len(variables) :])
    findings = []
    for layer, outputs, inputs in calls.values():
        own = [by_variable.get(id(v)) for v in own_weights(layer) if v.trainable]
        own += [next(by_tensor) for _ in outputs]
        into = [next(by_tensor) for _ in inputs]
        for reason, values in (("range", own), ("input_range", into)):
            share, largest = _underflow_at_safe_scale(_magnitudes(values))
            if share > UNDERFLOW_LIMIT:
                findings.append(Finding(forward.path(layer, model), reason, largest, share))
                break
    return findings


def _magnitudes(gradients: list) -> np.ndarray:
    return np.concatenate(
        [
            np.abs(np.asarray(tf.convert_to_tensor(g), np.float64)).ravel()
            for g in gradients
            if g is not None
        ]
        or [np.zeros(0)]
    )


def _underflow_at_safe_scale(magnitudes: np.ndarray) -> tuple[float, float]:
    """`(share, largest)`: the share of non-zero `magnitudes` below float16's
    smallest subnormal at the largest power of two that keeps the largest
    below float16's largest value."""
    nonzero = magnitudes[magnitudes > 0]
    if nonzero.size == 0 or not np.all(np.isfinite(nonzero)):
        return 0.0, float(nonzero.max()) if nonzero.size else 0.0
    largest = float(nonzero.max())
    scale = 2.0 ** math.floor(math.log2(FLOAT16_MAX / largest))
    # Below half the smallest subnormal, float16 rounds to zero.
    return float(np.mean(nonzero * scale < FLOAT16_TINY / 2)), largest
