"""Training outcomes on the fidelity benchmark's hard models.

The fidelity benchmark compares one batch's gradients; this one trains. Each
hard case of `benchmarks.harness.zoo` (vanishing gradients through 16 sigmoid layers,
a loss summed over a large batch, targets in the thousands, a small late loss)
is trained from the same initial weights on the same batches by every method,
and the outcome is the final training loss, evaluated in float32 on all of the
case's rows with the weights the method reached. The mechanism is checked at
the end too: the method's unscaled gradient of the first batch against the
float32 gradient at the same weights (underflow: the share of values non-zero
in float32 and zero in the method's; relative error), and its skipped steps.

The plan, fixed before any number: methods `float32`, `mixed_no_scaling`
(mixed_float16, no loss scale), `keras_lso` (Keras's `LossScaleOptimizer`,
defaults) and `als_max_safe` (keras_als, its default policy); seeds 0-4 (each
seed draws the initial weights and the batch order); `STEPS` Adam steps times
the case's `train_steps` at the case's learning rate and batch, XLA. Paired
differences (keras_als minus Keras's, per seed) with their standard errors.

`python -m benchmarks.hard_outcomes [--quick]` prints the table and writes
benchmarks/results/hard_outcomes.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from benchmarks.harness import isolation, scaling, stats, zoo
from benchmarks.suite import fidelity

STEPS = 1000
"""Adam steps per run, times the case's `train_steps`."""
SEEDS = (0, 1, 2, 3, 4)
METHODS: tuple[scaling.Method, ...] = (
    scaling.FLOAT32,
    scaling.NO_SCALING,
    scaling.KERAS_LSO,
    scaling.ALS_MAX_SAFE,
)


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


def paired(runs: list[dict], method: str, baseline: str) -> tuple[float, float]:
    """Mean and standard error over seeds of `method`'s final loss minus `baseline`'s."""
    return stats.mean_and_standard_error(
        [r[method]["final_loss"] - r[baseline]["final_loss"] for r in runs]
    )


def markdown(results: dict) -> str:
    """The outcome table: per case and method, mean over seeds, and the paired differences."""
    lines = [
        "# Training outcomes on the hard models",
        "",
        f"`python -m benchmarks.hard_outcomes`: {results['steps']} Adam steps (x3 for "
        f"late_small_loss), seeds {results['seeds']}, same initial weights and batches for "
        "every method. Final loss: float32 evaluation on all of the case's rows, mean over "
        "seeds. Underflow and error: the first batch's unscaled gradient at the end vs "
        "float32's at the same weights. Paired: keras_als minus Keras's "
        "`LossScaleOptimizer`, mean +- standard error over seeds (negative is better).",
        "",
        "| case | method | final loss | skipped steps | gradient underflow | gradient error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for case, runs in results["cases"].items():
        for method in runs[0]:
            mean = {k: statistics.mean(r[method][k] for r in runs) for k in runs[0][method]}
            lines.append(
                f"| {case} | {method} | {mean['final_loss']:.4g} | {mean['skipped']:.1f} "
                f"| {mean['underflow']:.2%} | {mean['error']:.3g} |"
            )
    lines += [
        "",
        "Paired differences in final loss, in % of float32's mean final loss:",
        "",
        "| case | keras_als - Keras LSO | no scaling - float32 | Keras LSO - float32 |",
        "| --- | --- | --- | --- |",
    ]
    for case, runs in results["cases"].items():
        base = statistics.mean(r["float32"]["final_loss"] for r in runs) / 100
        cells = []
        for method, baseline in (
            ("als_max_safe", "keras_lso"),
            ("mixed_no_scaling", "float32"),
            ("keras_lso", "float32"),
        ):
            mean, error = paired(runs, method, baseline)
            cells.append(f"{mean / base:+.3f}% ± {error / base:.3f}%")
        lines.append(f"| {case} | {' | '.join(cells)} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, 100 steps (a check)")
    parser.add_argument("--out", default="benchmarks/results/hard_outcomes")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.out + ".json") as f:
            table = markdown(json.load(f))
        with open(args.out + ".md", "w") as f:
            f.write(table)
        print(table)
        return
    seeds, steps = (SEEDS[:2], 100) if args.quick else (SEEDS, STEPS)
    hard = [c.name for c in zoo.cases() if c.hard]
    results = {"steps": steps, "seeds": list(seeds), "cases": {}}
    with isolation.worker_pool() as pool:
        for name in hard:
            runs = []
            for seed in seeds:  # one task at a time (see isolation.worker_pool)
                runs.append(pool.submit(run_case, name, seed, steps).result())
                print(
                    f"{name} seed {seed}: "
                    + ", ".join(
                        f"{m} {r['final_loss']:.4g} ({r['skipped']} skipped)"
                        for m, r in runs[-1].items()
                    ),
                    flush=True,
                )
            results["cases"][name] = runs
    table = markdown(results)
    print(table)
    if not args.quick:
        with open(args.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(table)


if __name__ == "__main__":
    main()
