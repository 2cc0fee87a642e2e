"""Gradient fidelity: the unscaled mixed-precision gradient against float32.

Metrics, with identical weights and batch: the relative
error `||g_mixed - g_fp32|| / ||g_fp32||` of each variable's gradient and its
underflow rate (share of elements non-zero in float32 and zero in the mixed run).

- `float32_gradients`, `mixed_gradients`, `compare`: the building blocks (also
  used by tests/test_mixed_precision.py).
- `measure_case`: the benchmark, every method on one `benchmarks.harness.zoo.Case`, at
  initialisation and after training; `measure_named_case` the same by the
  case's name (for a worker process: cases hold functions made at run time).
"""

from __future__ import annotations

import dataclasses

import keras
import numpy as np
import tensorflow as tf

from benchmarks.harness import isolation, scaling, xla_step, zoo


def float32_gradients(model, x, y, loss_fn) -> list[np.ndarray]:
    """Gradients of `loss_fn(y, model(x))` (training mode) as NumPy arrays."""
    with tf.GradientTape() as tape:
        loss = loss_fn(y, model(x, training=True))
    return [_dense(g) for g in tape.gradient(loss, model.trainable_variables)]


def mixed_gradients(model, optimizer, x, y, loss_fn) -> list[np.ndarray]:
    """True (unscaled) gradients through `optimizer.scale_loss` / `optimizer.unscale`, XLA."""

    @tf.function(jit_compile=True)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        return optimizer.unscale(grads, model.trainable_variables)

    return [_dense(g) for g in step(tf.constant(x), tf.constant(y))]


def compare(reference, measured, names) -> list[tuple[str, float, float]]:
    """Per variable: `(name, relative error, underflow rate)` of `measured` vs `reference`."""
    rows = []
    for name, r, m in zip(names, reference, measured):
        norm = np.linalg.norm(r)
        error = np.linalg.norm(m - r) / norm if norm > 0 else float(np.linalg.norm(m) > 0)
        nonzero = r != 0
        underflow = float(np.mean((m == 0)[nonzero])) if nonzero.any() else 0.0
        rows.append((name, error, underflow))
    return rows


# --------------------------------------------------------------------------------------
# The fidelity benchmark: every method against float32, per layer, before and after
# training. The three functions above are kept for tests/test_mixed_precision.py.
# --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Measurement:
    """Gradient fidelity of one method on one case at one phase.

    Attributes:
        case: The case name.
        method: The method name.
        phase: `"init"` (initial weights) or `"trained"` (after training with the
            method itself; the reference uses the same weights).
        layers: Per variable: `(name, relative error, underflow rate)`.
        error: Relative error of all gradients concatenated.
        underflow: Underflow rate over all gradient elements pooled.
        skipped: Steps skipped while training before this measurement.
        steps: Steps run before this measurement.
    """

    case: str
    method: str
    phase: str
    layers: list[tuple[str, float, float]]
    error: float
    underflow: float
    skipped: int
    steps: int

    @property
    def worst_layer_error(self) -> float:
        """The largest per-variable relative error."""
        return max(e for _, e, _ in self.layers)


def _dense(gradient) -> np.ndarray:
    """A gradient (dense or `tf.IndexedSlices`, as an Embedding's) as a float32 array."""
    return np.asarray(tf.convert_to_tensor(gradient), dtype=np.float32)


def reference_gradients(
    model: keras.Model, x: np.ndarray, y: np.ndarray, loss_fn: keras.losses.Loss
) -> list[np.ndarray]:
    """float32 gradients of `loss_fn` (training mode), dense, one per trainable variable."""

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
        return tape.gradient(loss, model.trainable_variables)

    return [_dense(g) for g in step(tf.constant(x), tf.constant(y))]


def overall(reference: list[np.ndarray], measured: list[np.ndarray]) -> tuple[float, float]:
    """Relative error of all gradients concatenated, and the pooled underflow rate."""
    r = np.concatenate([a.ravel() for a in reference])
    m = np.concatenate([a.ravel() for a in measured])
    nonzero = r != 0
    underflow = float(np.mean(m[nonzero] == 0)) if nonzero.any() else 0.0
    return float(np.linalg.norm(m - r) / np.linalg.norm(r)), underflow


class Runner:
    """A method's model and optimizer with compiled train and gradient steps."""

    def __init__(self, case: zoo.Case, method: scaling.Method, weights: list[np.ndarray]):
        self.case, self.method = case, method
        self.model, self.optimizer = method.build(
            case.builder, weights, keras.optimizers.Adam(case.learning_rate)
        )
        model, optimizer, loss_fn = self.model, self.optimizer, case.loss

        train_step = xla_step.compiled_step(model, optimizer, loss_fn)

        @tf.function(jit_compile=True)
        def gradient_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
                scaled = scaling.scale_loss(optimizer, loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            return scaling.true_gradients(optimizer, grads, model.trainable_variables)

        self.train_step, self.gradient_step = train_step, gradient_step
        self.steps = 0

    def train(self, batches: list[np.ndarray], learning_rate: float) -> None:
        """Runs one step per batch of row indices at `learning_rate`."""
        self.optimizer.learning_rate = learning_rate
        for index in batches:
            self.train_step(tf.constant(self.case.x[index]), tf.constant(self.case.y[index]))
        self.steps += len(batches)

    def gradients(self, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
        """The method's unscaled gradients on `(x, y)`, dense float32."""
        return [_dense(g) for g in self.gradient_step(tf.constant(x), tf.constant(y))]


def measure_case(
    case: zoo.Case,
    methods: list[scaling.Method],
    train_steps: int,
    settle_steps: int = 20,
) -> list[Measurement]:
    """Gradient fidelity of every mixed method on `case`, at init and after training.

    *init*: every method gets the same initial weights and runs `settle_steps`
    steps at learning rate 0 on the measured batch (its scales settle, the
    weights do not move), then its unscaled gradients are compared with float32.

    *trained*: every method first trains itself for `train_steps *
    case.train_steps` Adam steps (so its scales follow their own history, and
    its skipped steps are counted); then it is given the weights that float32
    training reached on the same batches, settles at learning rate 0 and is
    measured. All methods are thus compared at identical weights and batch.

    Args:
        case: The model, data and loss.
        methods: The methods; float32 ones are skipped (they are the reference).
        train_steps: The suite's training budget.
        settle_steps: Steps at learning rate 0 before each measurement.

    Returns:
        One `Measurement` per mixed method and phase.
    """
    isolation.fresh_session()
    isolation.set_seed(0)
    with scaling.precision("float32"):
        initial = case.builder().get_weights()
    rng = np.random.default_rng(1)
    steps = max(1, int(train_steps * case.train_steps))
    schedule = [rng.choice(len(case.x), case.batch, replace=False) for _ in range(steps)]
    settle = [np.arange(case.batch)] * settle_steps
    reference_run = Runner(case, scaling.FLOAT32, initial)
    reference_run.train(schedule, case.learning_rate)
    trained = reference_run.model.get_weights()
    reference_model = reference_run.model
    names = [v.path for v in reference_model.trainable_variables]
    x, y = case.x[: case.batch], case.y[: case.batch]
    references = {}
    for phase, weights in (("init", initial), ("trained", trained)):
        reference_model.set_weights(weights)
        references[phase] = reference_gradients(reference_model, x, y, case.loss)
    results = []
    for method in methods:
        if not method.mixed:
            continue
        runner = Runner(case, method, initial)
        for phase, weights in (("init", initial), ("trained", trained)):
            before = scaling.skipped_steps(runner.optimizer, runner.steps)
            if phase == "trained":
                runner.train(schedule, case.learning_rate)
                runner.model.set_weights(weights)
            runner.train(settle, 0.0)
            measured = runner.gradients(x, y)
            rows = compare(references[phase], measured, names)
            error, underflow = overall(references[phase], measured)
            skipped = scaling.skipped_steps(runner.optimizer, runner.steps) - before
            results.append(
                Measurement(
                    case.name, method.name, phase, rows, error, underflow, skipped, runner.steps
                )
            )
    return results


def measure_named_case(
    name: str, methods: list[scaling.Method], train_steps: int
) -> list[Measurement]:
    """`measure_case` on the `benchmarks.harness.zoo` case called `name`."""
    (case,) = [c for c in zoo.cases() if c.name == name]
    return measure_case(case, methods, train_steps)
