"""`Float32Fallback`: during `fit`, the layers float16 cannot hold move to float32.

A loss scale cannot widen float16's range. When `fit` begins, before its first
step, this callback diagnoses a batch the user gives it, computes the layers
it names in float32 and chooses every scale from a float32 measurement of the
same batch (`keras_als.calibrate`), so that no step is skipped finding them.
A resumed `fit` (a model rebuilt from code and restored from a checkpoint,
whose weights hold no dtype policy) is diagnosed again before its first step.
Then, when the optimizer's telemetry says a layer's gradients outran it
(`telemetry()["beyond_float16"]`: an overflow started there at a scale below
1), or the steps keep being skipped (a forward pass that is not finite in
float16 overflows at every scale), or overflows keep starting in one layer
(gradients far larger on a few batches than on the others), it diagnoses
the batch again, with the weights as they are, computes the layers it names
(and that layer) in float32 and traces the training step again, once per
new finding. Until then it reads one variable
before each batch, and leaves `fit`'s asynchronous dispatch of the other
callbacks on (it has no `on_train_batch_end`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import keras

from keras_als.float32 import _forward_checks as forward
from keras_als.float32.calibration import calibrate
from keras_als.float32.diagnosis import Diagnosis, Finding, diagnosed_with
from keras_als.optimizer import AdaptiveLossScaleOptimizer
from keras_als.step import _entries
from keras_als.telemetry import _mistakes

REPEATED_WITHIN = 50
"""Steps within which `repeated_overflows` overflows starting in one layer
move it to float32."""


class Float32Fallback(keras.callbacks.Callback):
    """Computes in float32, during `fit`, the layers whose gradients or outputs
    float16 cannot hold, as `keras_als.diagnose` measures them.

    When `fit` begins on a model that has not trained yet (`at_start`), it
    diagnoses `(x, y)`, computes the layers found in float32, and calibrates
    the scales on `(x, y)` (`keras_als.calibrate`), before the first step.
    When a resumed `fit` begins (the optimizer has taken steps, and this
    callback has not changed the model: a model rebuilt from code and
    restored by `keras.callbacks.BackupAndRestore` or `load_weights`), it
    diagnoses `(x, y)` with the restored weights the same way, without
    calibrating (the scales were restored): the layers it moved to float32
    before come back, since no weights file holds a dtype policy (a
    `.keras` file does). Both happen at the first batch, after every
    callback's `on_train_begin`, wherever `BackupAndRestore` is listed.
    Then, before each batch, if the step before it was skipped, it reads the
    optimizer's telemetry.
    If it names layers beyond float16's range that it has not seen yet, or
    `skipped_in_a_row` steps in a row were skipped, it diagnoses `(x, y)` with
    the current weights; the layers found (not yet in float32) get
    `dtype_policy = "float32"` and the training step is traced again before
    the next batch (one compilation). A float16 layer where overflows started
    on `repeated_overflows` steps within `REPEATED_WITHIN` (50), although
    its scale backed off after each, joins them (a `"overflows"` finding,
    with the layers that must compute in float32 with it): its gradients are
    tiny on most batches and far larger on a few, a span no scale chosen
    from the batches before holds (a LayerNorm's over near-constant inputs:
    RWKV7's). At most `rounds` diagnoses per `fit`.
    What it did is in `self.applied` (`(step, layer paths)` pairs) and, with
    `verbose`, printed.

    It changes a layer's precision, so the mathematics of those layers is
    float32's from then on: the model trains as it would with those layers
    set to float32 before `fit` (`keras_als.diagnose(model, x, y).apply(model)`),
    which a custom training loop does (it cannot retrace the user's
    `tf.function` itself).

    Args:
        x: A batch of inputs the model trains on (a few dozen examples).
        y: Its targets.
        loss: `loss(y, y_pred)`, as `diagnose` takes it; None: the model's own.
        skipped_in_a_row: Steps skipped in a row that call for a diagnosis
            even when no layer is named beyond float16.
        rounds: Most diagnoses in one `fit`, besides the one at the start.
        repeated_overflows: Overflows starting in one float16 layer within
            `REPEATED_WITHIN` steps that move it to float32.
        at_start: Whether to diagnose and calibrate when `fit` begins, if the
            optimizer has taken no step yet (a resumed `fit` is diagnosed
            either way).
        verbose: Whether to print each diagnosis that changed the model.

    Example:

    >>> import keras, numpy as np, keras_als
    >>> keras.config.set_dtype_policy("mixed_float16")
    >>> model = keras_als.wrap_model(keras.Sequential([
    ...     keras.Input((4,)),
    ...     keras.layers.Dense(4, name="huge",
    ...                        kernel_initializer=keras.initializers.Constant(1e5)),
    ...     keras.layers.Dense(1, name="head", dtype="float32")]))
    >>> model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3)), "mse")
    >>> x, y = np.ones((16, 4), "float32"), np.zeros((16, 1), "float32")
    >>> fallback = keras_als.Float32Fallback(x[:8], y[:8], verbose=False)
    >>> _ = model.fit(x, y, batch_size=2, verbose=0, callbacks=[fallback])
    >>> fallback.applied
    [(0, ['huge'])]
    >>> int(model.optimizer.skipped_steps)
    0
    >>> model.get_layer("huge").compute_dtype
    'float32'
    >>> keras.config.set_dtype_policy("float32")
    """

    def __init__(
        self,
        x,
        y=None,
        loss: Callable | None = None,
        skipped_in_a_row: int = 8,
        rounds: int = 3,
        repeated_overflows: int = 3,
        verbose: bool = True,
        at_start: bool = True,
    ):
        super().__init__()
        if min(skipped_in_a_row, rounds, repeated_overflows) < 1:
            raise ValueError(
                "Float32Fallback(skipped_in_a_row=..., rounds=..., repeated_overflows=...) "
                f"take whole numbers >= 1, got {skipped_in_a_row!r}, {rounds!r} and "
                f"{repeated_overflows!r}."
            )
        self.x, self.y, self.loss = x, y, loss
        self.skipped_in_a_row = skipped_in_a_row
        self.rounds = rounds
        self.repeated_overflows = repeated_overflows
        self.verbose = verbose
        self.at_start = bool(at_start)
        self.applied: list[tuple[int, list[str]]] = []
        self._diagnoses = 0
        self._skipped = 0
        self._seen: set[str] = set()
        self._overflow_steps: dict[str, list[int]] = {}  # by scale name: where they started
        self._overflow_counts: dict[str, int] = {}  # as last read (a resumed run's too)
        self._first_batch = False
        self._model_seen = None  # the model of the last fit

    def on_train_begin(self, logs=None):
        _mistakes.adaptive_optimizer(
            self.model.optimizer, AdaptiveLossScaleOptimizer, "Float32Fallback"
        )
        self._diagnoses = 0
        self._first_batch = True

    def _begin(self) -> None:
        """At the first batch of a `fit`, once every callback's `on_train_begin`
        has run (`BackupAndRestore` has restored the weights and the
        optimizer, wherever it is listed): before the first step, diagnose
        and calibrate; on a resumed run (steps taken, and this callback has
        not changed this model yet), diagnose again with the restored
        weights, since the layers moved to float32 before the interruption
        are float16 again in a model rebuilt from code (its weights and
        optimizer state hold no dtype policy)."""
        telemetry = self.model.optimizer.telemetry(warn=False)
        steps = telemetry["steps"]
        self._overflow_counts = dict(telemetry["overflows"])
        self._skipped = self._skipped_steps()
        resumed = steps > 0 and not self.applied and self._model_seen is not self.model
        self._model_seen = self.model
        if (self.at_start and not steps) or resumed:
            # A forward finding hides the layers after it: diagnose again.
            for _ in range(self.rounds):
                if not self._diagnose(steps):
                    break
        if self.at_start and not steps:
            calibrate(self.model, self.x, self.y, loss=self.loss)

    def on_train_batch_begin(self, batch, logs=None):
        # Not on_train_batch_end: a callback with one makes `fit` wait for and
        # convert every batch's logs on the host. The step before this batch
        # has run, and `fit` reads `train_function` after this returns.
        if self._first_batch:
            self._first_batch = False
            self._begin()
            return
        if self._diagnoses >= self.rounds:
            return
        skipped = self._skipped_steps()
        if skipped == self._skipped:
            return
        self._skipped = skipped
        telemetry = self.model.optimizer.telemetry(warn=False)
        new = set(telemetry["beyond_float16"]) - self._seen
        stuck = telemetry["skipped_in_a_row"] >= self.skipped_in_a_row
        repeated = self._repeated_overflows(telemetry)
        if not new and not stuck and not repeated:
            return
        self._seen |= new
        self._diagnoses += 1
        self._diagnose(telemetry["steps"], repeated)

    def _repeated_overflows(self, telemetry: dict) -> list[Finding]:
        """The float16 layers where overflows started on `repeated_overflows`
        steps within `REPEATED_WITHIN`, as findings (the overflows' steps).
        Read after every skipped step, so at most one new start a layer."""
        found = []
        for owner, _, name in _entries.scaled(self.model.optimizer.scaling):
            count = telemetry["overflows"].get(name, 0)
            steps = self._overflow_steps.setdefault(name, [])
            if count > self._overflow_counts.get(name, 0):
                steps.append(telemetry["last_overflow_step"][name])
            self._overflow_counts[name] = count
            recent = steps[-self.repeated_overflows :]
            if (
                len(recent) == self.repeated_overflows
                and recent[-1] - recent[0] < REPEATED_WITHIN
                and owner.layer.compute_dtype == "float16"
            ):
                path = forward.path(owner.layer, self.model)
                found.append(Finding(path, "overflows", overflows=tuple(recent)))
        return found

    def _diagnose(self, step: int, repeated: Sequence[Finding] = ()) -> bool:
        """Diagnoses `(x, y)` and computes the layers found, not yet in float32,
        with the layers of `repeated` and those that must go with them, in
        float32; whether there were any."""
        found = diagnosed_with(self.model, self.x, self.y, self.loss, repeated)
        layers = [p for p in found.layers if p not in _float32_paths(self.applied)]
        if not layers:
            return False
        Diagnosis(tuple(f for f in found.findings if f.layer in layers)).apply(self.model)
        self.model.make_train_function(force=True)  # fit calls it for the next batch
        self.applied.append((step, layers))
        if self.verbose:
            print(f"keras_als.Float32Fallback, at step {step}: {found}")
        return True

    def _skipped_steps(self) -> int:
        return self.model.optimizer.skipped_step_count()


def _float32_paths(applied: list[tuple[int, list[str]]]) -> set[str]:
    return {path for _, paths in applied for path in paths}
