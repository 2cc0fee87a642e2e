"""loss_span.md, its plot, and loss_span_float16_heads.md."""

from __future__ import annotations

import math
import statistics

from benchmarks.harness import stats
from benchmarks.loss_span.training import (
    BATCH,
    EPOCHS,
    LEARNING_RATE,
    METHODS,
    PER_OUTPUT_EXPONENT,
    PER_OUTPUT_METHODS,
    TRAIN,
    Run,
)


def paired(runs: list[Run], exponent: float, method: str, against: str) -> tuple[float, float]:
    """Accuracy of `method` minus `against`, in points, paired by seed: (mean, s.e.)."""
    ours = {r.seed: r.accuracy for r in runs if r.exponent == exponent and r.method == method}
    theirs = {r.seed: r.accuracy for r in runs if r.exponent == exponent and r.method == against}
    return stats.paired_by_seed(ours, theirs, scale=100.0)[:2]


def _mean_sd(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [scale * v for v in values]
    if not values:
        return "-"
    if any(not math.isfinite(v) for v in values):
        return "nan"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def markdown(results: dict, image: str | None) -> str:
    runs = [Run(**r) for r in results["runs"]]
    exponents = sorted({r.exponent for r in runs})
    seeds = sorted({r.seed for r in runs})
    lines = [
        "# Two losses far apart (`benchmarks/loss_span/`)",
        "",
        f"- Command: `{results['command']}`; {results['date']}; keras_als at {results['commit']}",
        f"- Seeds {seeds}; {EPOCHS} epochs of {TRAIN // BATCH} batches of {BATCH}; Adam "
        f"{LEARNING_RATE:g}; XLA; wall time {results['seconds']:.0f} s",
        "- Outcome: held-out accuracy (%) of the digit head, mean ± sd over seeds. Paired:"
        " keras_als minus Keras LSO, in points, mean ± standard error over seeds.",
        "- flushed: share of the digit branch's weight gradients that flush to zero at the"
        " scale its optimizer ended with (none at 2^12).",
        "",
        "| value targets | float32 | mixed, no scaling | Keras LSO | keras_als "
        "| keras_als − Keras LSO | flushed Keras LSO | flushed keras_als "
        "| Keras LSO scale | keras_als scales, digit0-3 "
        "| skipped Keras LSO / keras_als |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in exponents:
        by = {m: [r for r in runs if r.exponent == e and r.method == m] for m in METHODS}
        mean, error = paired(runs, e, "keras_als", "keras_lso")
        keras_scales = sorted({r.scales["digit"] for r in by["keras_lso"]})
        # The float16 layers of the digit branch (its float32 head computes in float32).
        ours = [s for r in by["keras_als"] for n, s in r.scales.items() if n != "digit"]
        lines.append(
            f"| 10^{e:g} | "
            + " | ".join(_mean_sd([r.accuracy for r in by[m]], 100) for m in METHODS)
            + f" | {mean:+.1f} ± {error:.1f} | "
            + _mean_sd([r.flushed for r in by["keras_lso"]], 100, 1)
            + "% | "
            + _mean_sd([r.flushed for r in by["keras_als"]], 100, 1)
            + "% | "
            + ", ".join(f"2^{math.log2(s):.0f}" for s in keras_scales)
            + f" | 2^{math.log2(min(ours)):.0f}..2^{math.log2(max(ours)):.0f} | "
            + f"{sum(r.skipped for r in by['keras_lso'])} / "
            + f"{sum(r.skipped for r in by['keras_als'])} |"
        )
    if image:
        lines += ["", f"![digit accuracy against the value targets' magnitude]({image})"]
    return "\n".join(lines) + "\n"


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [Run(**r) for r in results["runs"]]
    exponents = sorted({r.exponent for r in runs})
    figure, axis = plt.subplots(figsize=(6.4, 4.0))
    labels = {
        "float32": "float32",
        "mixed_no_scaling": "mixed_float16, no scaling",
        "keras_lso": "Keras LossScaleOptimizer",
        "keras_als": "keras_als",
    }
    for method in METHODS:
        means, errors = [], []
        for e in exponents:
            values = [100 * r.accuracy for r in runs if r.exponent == e and r.method == method]
            means.append(statistics.fmean(values))
            errors.append(statistics.stdev(values) if len(values) > 1 else 0.0)
        axis.errorbar(exponents, means, yerr=errors, marker="o", capsize=3, label=labels[method])
    axis.set_xlabel("value targets ~ 10^k: k (the other loss's gradient magnitude)")
    axis.set_ylabel("digit head held-out accuracy (%)")
    axis.set_title("Two losses far apart: one global scale against layer-wise scales")
    axis.legend(loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def per_output_markdown(runs: list[Run]) -> str:
    """The per-loss-scales table: float16 heads at `10**PER_OUTPUT_EXPONENT`."""
    lines = [
        "# Per-loss scales: float16 heads",
        "",
        "`python -m benchmarks.loss_span --float16-heads`: value targets "
        f"~10^{PER_OUTPUT_EXPONENT}, the digit head's last Dense in float16, seeds "
        f"{sorted({r.seed for r in runs})}, otherwise the loss_span plan. Flushed: share of "
        "the digit branch's weight gradients that are zero at the scales the run ended with "
        "though not at 2^12, each layer at its own scale (it does not follow the chain: "
        "for keras_als with one loss scale the float16 digit layer's gradient flushes "
        "and the layers under it receive nothing, which this share does not show). "
        "Paired: accuracy minus Keras LSO's, points, mean ± s.e.",
        "",
        "| method | digit accuracy (%) | flushed (%) | skipped | digit head's scale "
        "| paired vs Keras LSO |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method in PER_OUTPUT_METHODS:
        mine = [r for r in runs if r.method == method]
        mean, error = paired(runs, PER_OUTPUT_EXPONENT, method, "keras_lso")
        head = sorted({r.scales.get("digit", float("nan")) for r in mine})
        lines.append(
            f"| {method} | {_mean_sd([r.accuracy for r in mine], 100)} "
            f"| {_mean_sd([r.flushed for r in mine], 100)} "
            f"| {_mean_sd([float(r.skipped) for r in mine], 1, 1)} "
            f"| {', '.join(f'{s:.3g}' for s in head)} "
            f"| {'-' if method == 'keras_lso' else f'{mean:+.1f} ± {error:.1f}'} |"
        )
    return "\n".join(lines) + "\n"
