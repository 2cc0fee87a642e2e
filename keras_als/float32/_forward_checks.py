"""The forward pass watched layer by layer, for `diagnose`.

- `forward_not_finite`: the innermost layers whose float16 output is not
  finite while their inputs are (or whose input overflows in its cast to
  float16, or whose float16 call raises where its float32 call does not,
  run eagerly or traced in a graph as `fit` traces it), found again with
  those in float32 until none is left;
- `mixing_layers`: the layers whose call fails once given layers compute in
  float32, because it combines their float32 output with its own float16
  tensors in raw operations (Keras casts a layer's inputs, not the tensors
  inside its `call`);
- `recording_calls`, `policies_kept`, `to_float32`: the means, each a layer's
  `call` hooked, its dtype policy set and restored;
- `state_kept`, `loss_of`: what `diagnose` and `calibrate` share for their
  one pass over a batch outside training: the variables it moves restored,
  and the loss as `fit` takes it.
"""

from __future__ import annotations

import contextlib
import re

import tensorflow as tf

from keras_als._keras_private import all_layers
from keras_als.policies._policy_terms import FLOAT16_MAX


@contextlib.contextmanager
def policies_kept(model):
    """Restores the dtype policy of every layer of `model` when the context closes."""
    policies = [(layer, layer.dtype_policy) for layer in all_layers(model, include_self=True)]
    try:
        yield
    finally:
        for layer, policy in policies:
            layer.dtype_policy = policy


def to_float32(layers: list) -> None:
    """Sets each of `layers`, and every layer inside it, to compute in float32."""
    for layer in layers:
        for inner in all_layers(layer, include_self=True):
            inner.dtype_policy = "float32"


@contextlib.contextmanager
def state_kept(model):
    """Restores what a forward pass in training mode moves: the model's
    non-trainable variables (BatchNormalization's moving statistics, the
    seed generators' states that Dropout draws from) and its metrics'
    variables (the loss tracker `compute_loss` updates), so that a diagnosis
    in the middle of `fit` leaves training exactly as it would have gone."""
    variables = [*model.non_trainable_variables, *getattr(model, "metrics_variables", [])]
    values = [tf.identity(v.value) for v in variables]
    try:
        yield
    finally:
        for variable, value in zip(variables, values):
            variable.assign(value)


def loss_of(model, x, y, y_pred, loss) -> tf.Tensor:
    """The float32 loss of `y_pred`: `loss(y, y_pred)`, or, where `loss` is
    None, the model's own (`model.compute_loss`, as `fit` takes it)."""
    if loss is not None:
        return tf.cast(loss(y, y_pred), tf.float32)
    value = model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=None)
    return tf.cast(value, tf.float32)


def path(layer, model) -> str:
    """`layer`'s path inside `model` (a Sequential's layers' paths start with its name)."""
    full, prefix = layer.path or layer.name, f"{model.path or model.name}/"
    return full[len(prefix) :] if full.startswith(prefix) else full


def layers_by_path(model, paths: list[str]) -> list:
    found = {path(layer, model): layer for layer in all_layers(model, include_self=False)}
    missing = [p for p in paths if p not in found]
    if missing:
        raise ValueError(
            f"keras_als: no layer of {model.name!r} has the path(s) {missing}: apply a "
            "diagnosis to the model it was made for."
        )
    return [found[p] for p in paths]


def floats(structure) -> list:
    return [
        t
        for t in tf.nest.flatten(structure)
        if isinstance(t, tf.Tensor | tf.Variable) and t.dtype.is_floating
    ]


@contextlib.contextmanager
def recording_calls(model, record, before=None):
    """Every layer of `model` at any depth reports `(layer, args, kwargs,
    outputs)` of each call to `record` (and `(layer, args, kwargs)` to
    `before`, if given, as the call starts) while the context is open."""
    layers = all_layers(model, include_self=False)
    saved = []
    for layer in layers:
        method = layer.call
        had_own = "call" in layer.__dict__

        def call(*args, _layer=layer, _method=method, **kwargs):
            if before is not None:
                before(_layer, args, kwargs)
            outputs = _method(*args, **kwargs)
            record(_layer, args, kwargs, outputs)
            return outputs

        # Past Keras's __setattr__, as `wrap_model`'s hooks are: a function is no state.
        object.__setattr__(layer, "call", call)
        saved.append((layer, had_own, method))
    try:
        yield
    finally:
        for layer, had_own, method in saved:
            if had_own:
                object.__setattr__(layer, "call", method)
            else:
                object.__delattr__(layer, "call")


@contextlib.contextmanager
def layers_calling(model):
    """While the context is open, the list it yields holds the layers of
    `model` whose call has begun and not ended, innermost last: after a call
    raised, the layer it raised in is last."""
    calling = []

    def before(layer, args, kwargs):
        calling.append(layer)

    def record(layer, args, kwargs, outputs):
        calling.pop()

    with recording_calls(model, record, before):
        yield calling


class CallRaised(Exception):
    """The forward pass raised `error` inside the call of the layer at `path`
    (the innermost whose call had begun and not ended; None: outside any),
    run eagerly or, `in_graph`, traced in a `tf.function`."""

    def __init__(self, path: str | None, error: BaseException, in_graph: bool = False):
        super().__init__(path, error)
        self.path, self.error, self.in_graph = path, error, in_graph


def forward_not_finite(model, x) -> list[tuple[str, str, str]]:
    """The innermost layers whose float16 output is not finite, inputs finite
    (or whose input cast to float16 is not, or whose call raises), as
    `(path, reason, error text)` (the text empty but for `"raises"`).

    A layer downstream of one whose output is not finite shows only once that
    one computes in float32, so the forward pass runs again with the layers
    found so far in float32 until it finds no more (policies restored after).
    Once it finds none eagerly, the forward pass is traced in a graph, as
    `fit` traces it (`raises_in_a_graph`): some float16 operations run
    eagerly and have no kernel in a graph.
    A layer whose call raises is tried again in float32 so: where it raises
    again (or the error is outside any layer's call), float32 is no fix, and
    the model is called once more as it is, without hooks, so that the error
    it raises reaches the caller as calling the model would raise it. An
    error raised only in a graph that float32 raises too is left to `fit`,
    which traces the model: the layers found so far are returned, less the
    one that raised.
    """
    found: list[tuple[str, str, str]] = []
    errors: dict[str, BaseException] = {}
    with policies_kept(model):
        while True:
            try:
                new = [(p, r, "") for p, r in first_not_finite(model, x)]
                new = [f for f in new if f[0] not in [p for p, _, _ in found]]
                if not new:
                    raises_in_a_graph(model, x)
            except CallRaised as raised:
                if raised.path is None or raised.path in errors:
                    if raised.in_graph:  # not float16's doing: fit raises it
                        return [f for f in found if f[0] != raised.path]
                    error = raised.error
                    break
                errors[raised.path] = raised.error
                new = [(raised.path, "raises", error_text(raised.error))]
            if not new:
                return found
            found += new
            to_float32(layers_by_path(model, [p for p, _, _ in new]))
    model(x, training=True)  # raises, as it does for the user
    raise error  # unless it did not this time


def raises_in_a_graph(model, x) -> None:
    """Traces `model(x, training=True)` in a `tf.function`, as `fit` traces
    its step, without running it; raises `CallRaised` (`in_graph`) naming
    the innermost layer whose call raised. TensorFlow has eager kernels for
    some float16 operations and none in a graph (`tf.range` in float16: a
    rotary position embedding's), so such a layer raises only here."""
    traced = tf.function(lambda inputs: model(inputs, training=True))
    with layers_calling(model) as calling:
        try:
            traced.get_concrete_function(x)
        except Exception as error:  # any error of a layer's call in a graph
            raised = path(calling[-1], model) if calling else None
            raise CallRaised(raised, error, in_graph=True) from error


def error_text(error: BaseException, longest: int = 240) -> str:
    """`error`'s type and the first line of its own message, at most `longest`
    characters: Keras puts "Exception encountered when calling ..." before the
    message of an error inside a layer's call, and marks it in bold; an
    error raised while a `tf.function` traces starts with the frames of
    "in user code:", and names the error's own type after them."""
    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    name = type(error).__name__
    if plain.startswith("in user code:"):
        inner = list(re.finditer(r"^\s+([A-Za-z_]\w*): (.*)$", plain, re.MULTILINE))
        inner = [m for m in inner if m.group(1).endswith(("Error", "Exception"))]
        if inner:
            name, plain = inner[-1].group(1), plain[inner[-1].start(2) :]
    lines = [
        line.strip()
        for line in plain.splitlines()
        if line.strip() and not line.strip().startswith("Exception encountered when calling")
    ]
    text = f"{name}: {lines[0] if lines else ''}"
    return text if len(text) <= longest else text[: longest - 3] + "..."


def first_not_finite(model, x) -> list[tuple[str, str]]:
    """The layers where the forward pass first stops being finite: a layer's
    output not finite while its inputs are, or a layer whose inputs arrive
    not finite while no output before was (the cast of a float32 input to
    its float16 overflowed: Keras casts inputs before `call`). The second
    only for a float16 layer whose non-finite inputs are infinities, not NaN,
    after some finite output beyond float16's range: what such a cast makes."""
    origins = []
    seen = {"not_finite": False, "beyond_float16": False}
    calling = []  # the layers whose call has begun and not ended

    def finite(structure):
        return all(bool(tf.reduce_all(tf.math.is_finite(t))) for t in floats(structure))

    def before(layer, args, kwargs):
        calling.append(layer)
        if seen["not_finite"] or finite((args, kwargs)):
            return
        seen["not_finite"] = True
        nan = any(bool(tf.reduce_any(tf.math.is_nan(t))) for t in floats((args, kwargs)))
        if seen["beyond_float16"] and not nan and layer.compute_dtype == "float16":
            origins.append((layer, "input"))

    def record(layer, args, kwargs, outputs):
        calling.pop()
        if not finite(outputs):
            if finite((args, kwargs)):
                origins.append((layer, "forward"))
            seen["not_finite"] = True
        elif any(bool(tf.reduce_max(tf.abs(t)) > FLOAT16_MAX) for t in floats(outputs)):
            seen["beyond_float16"] = True

    if not finite(x):
        raise ValueError("keras_als.diagnose: the inputs x are not finite; check the data.")
    try:
        with recording_calls(model, record, before):
            model(x, training=True)
    except Exception as error:  # any error of a layer's float16 call
        raise CallRaised(path(calling[-1], model) if calling else None, error) from error
    paths = []
    for layer, reason in origins:
        inner = {id(i) for i in all_layers(layer, include_self=False)}
        layer_path = path(layer, model)
        if not any(id(o) in inner for o, _ in origins) and layer_path not in [p for p, _ in paths]:
            paths.append((layer_path, reason))
    return paths


def mixing_layers(model, x, paths: list[str]) -> list[str]:
    """The layers that must compute in float32 too for `model` to run with
    the layers at `paths` in float32: a layer that owns one of them and
    combines its float32 output with its own float16 tensors in raw
    operations fails with a dtype mismatch. Each try runs the forward pass
    with the layers found so far in float32; the innermost layer whose call
    raised joins them."""
    found, added = list(paths), []
    while found:
        with policies_kept(model), layers_calling(model) as calling:
            to_float32(layers_by_path(model, found))
            try:
                model(x, training=True)
                return added
            except (TypeError, tf.errors.InvalidArgumentError):
                raised = path(calling[-1], model) if calling else None
                if raised is None or raised in found:
                    raise
        found.append(raised)
        added.append(raised)
    return added
