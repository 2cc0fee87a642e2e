"""One run: every method trained on one hard case from the same weights and batches."""

from __future__ import annotations

import numpy as np

from benchmarks.hard_outcomes.plan import METHODS
from benchmarks.harness import isolation, scaling, zoo
from benchmarks.suite import fidelity


def run_case(name: str, seed: int, steps: int) -> dict:
    """Every method on the hard case `name` with `seed`: outcome and mechanism.

    Returns:
        Per method name: `final_loss` (float32, all rows), `skipped`, and at the
        end `underflow` and `error` of the first batch's gradient vs float32.
    """
    (case,) = [c for c in zoo.cases() if c.name == name]
    isolation.fresh_session()
    isolation.set_seed(seed)
    with scaling.precision("float32"):
        initial = case.builder().get_weights()
        reference = case.builder()
    rng = np.random.default_rng(seed)
    total = max(1, int(steps * case.train_steps))
    schedule = [rng.choice(len(case.x), case.batch, replace=False) for _ in range(total)]
    x, y = case.x[: case.batch], case.y[: case.batch]
    outcome = {}
    for method in METHODS:
        runner = fidelity.Runner(case, method, initial)
        runner.train(schedule, case.learning_rate)
        reference.set_weights(runner.model.get_weights())
        expected = fidelity.reference_gradients(reference, x, y, case.loss)
        error, underflow = fidelity.overall(expected, runner.gradients(x, y))
        predicted = reference.predict(case.x, batch_size=256, verbose=0)
        outcome[method.name] = {
            "final_loss": float(case.loss(case.y, predicted)),
            "skipped": scaling.skipped_steps(runner.optimizer, runner.steps),
            "underflow": underflow,
            "error": error,
        }
    return outcome
