"""The outcome table and the paired differences, from the saved runs."""

from __future__ import annotations

import statistics

from benchmarks.harness import stats


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
