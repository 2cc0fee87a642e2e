"""The five targets of the benchmark issue (3), judged from measured results.

Everything here is a pure function of the results (plain dataclasses), so the
PASS/FAIL logic can be tested on synthetic numbers."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np

from benchmarks.harness import stats
from benchmarks.suite.convergence import Run
from benchmarks.suite.fidelity import Measurement
from benchmarks.suite.records import Memory, Timing

OURS = "als_max_safe"
"""The keras_als configuration the targets judge: its default policy."""
BASELINE = "keras_lso"
TOLERANCE = 1.01
"""Errors within 1% count as equal: with no underflow both methods sit on the same
float16 forward-rounding floor and differ in the fourth digit at most."""


@dataclasses.dataclass
class Target:
    """One target of the issue and whether the measurements meet it."""

    number: int
    passed: bool
    summary: str
    detail: list[str] = dataclasses.field(default_factory=list)

    def line(self) -> str:
        """The PASS/FAIL line printed at the end of the run."""
        return f"Target {self.number}: {'PASS' if self.passed else 'FAIL'} - {self.summary}"


def layer_mean_error(m: Measurement) -> float:
    """Mean over variables of the relative gradient error (every layer counts once)."""
    return statistics.fmean(e for _, e, _ in m.layers)


def fmt(x: float) -> str:
    return "inf" if math.isinf(x) else ("nan" if math.isnan(x) else f"{x:.2e}")


def target_fidelity(measurements: list[Measurement], hard: set[str]) -> Target:
    """Target 1: error <= Keras LSO's on every model; underflow <= a tenth on hard cases.

    The error compared is the mean over layers (`layer_mean_error`), at both
    phases, within `TOLERANCE`; the underflow is pooled over all elements.
    """
    by_key = {(m.case, m.phase, m.method): m for m in measurements}
    error_failures, underflow_failures, checked, hard_checked = [], [], 0, 0
    for (case, phase, method), ours in by_key.items():
        if method != OURS or (case, phase, BASELINE) not in by_key:
            continue
        theirs = by_key[(case, phase, BASELINE)]
        checked += 1
        if not layer_mean_error(ours) <= TOLERANCE * layer_mean_error(theirs):
            error_failures.append(
                f"{case}/{phase}: error {fmt(layer_mean_error(ours))} > "
                f"Keras LSO {fmt(layer_mean_error(theirs))}"
            )
        if case in hard:
            hard_checked += 1
            if not ours.underflow <= theirs.underflow / 10:
                underflow_failures.append(
                    f"{case}/{phase}: underflow {ours.underflow:.4f} > Keras LSO "
                    f"{theirs.underflow:.4f} / 10"
                )
    failures = error_failures + underflow_failures
    summary = (
        f"gradient error <= Keras LSO on {checked - len(error_failures)}/{checked} "
        f"model-phases; underflow <= 1/10 of Keras LSO on "
        f"{hard_checked - len(underflow_failures)}/{hard_checked} hard model-phases"
    )
    if failures:
        summary += f"; missed: {'; '.join(failures)}"
    return Target(1, checked > 0 and not failures, summary, failures)


def accuracy_summary(runs: list[Run]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """`(task, method) -> (mean accuracy %, standard deviation %, seeds)`."""
    groups: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        groups.setdefault((r.task, r.method), []).append(100.0 * r.accuracy)
    return {
        k: (statistics.fmean(v), statistics.stdev(v) if len(v) > 1 else 0.0, len(v))
        for k, v in groups.items()
    }


def skipped_per_1000(runs: list[Run], task: str, method: str) -> float:
    """Skipped steps per 1,000 steps after the first 100, pooled over seeds."""
    chosen = [r for r in runs if r.task == task and r.method == method]
    steps = sum(max(0, r.steps - 100) for r in chosen)
    return 1000.0 * sum(r.skipped_after_100 for r in chosen) / steps if steps else float("nan")


TIE_SEEDS = 5
"""Fewest paired seeds for a shortfall within seed noise to count as a tie."""


def paired_difference(runs: list[Run], task: str, method: str) -> tuple[float, float, int]:
    """Accuracy of `method` minus Keras LSO's, paired by seed, in points.

    Returns:
        `(mean, standard error of the mean, seeds)`; the error is NaN for one seed.
    """
    mine = {r.seed: r.accuracy for r in runs if r.task == task and r.method == method}
    theirs = {r.seed: r.accuracy for r in runs if r.task == task and r.method == BASELINE}
    return stats.paired_by_seed(mine, theirs, scale=100.0)


def target_accuracy(runs: list[Run]) -> Target:
    """Target 2: within 0.5 points of float32 (mean over seeds), not below Keras LSO.

    Both methods train from the same weights on the same batches per seed, so
    they are compared by seed. keras_als is below Keras LSO if its mean is
    lower and the paired difference is more than two standard errors below
    zero over at least `TIE_SEEDS` seeds; within two standard errors the two
    are tied within seed noise, and the line says so.
    """
    acc = accuracy_summary(runs)
    parts, failures = [], []
    for task in sorted({r.task for r in runs}):
        ours, f32, lso = (acc.get((task, m)) for m in (OURS, "float32", BASELINE))
        if ours is None or f32 is None or lso is None:
            failures.append(f"{task}: missing runs")
            continue
        mean, error, seeds = paired_difference(runs, task, OURS)
        part = (
            f"{task} {ours[0]:.2f}% vs float32 {f32[0]:.2f}%, Keras LSO {lso[0]:.2f}% "
            f"({ours[2]} seeds)"
        )
        if ours[0] < f32[0] - 0.5:
            failures.append(f"{task}: {ours[0] - f32[0]:+.2f} points vs float32")
        if ours[0] < lso[0]:
            if seeds >= TIE_SEEDS and mean + 2 * error >= 0:
                part += (
                    f", tied with Keras LSO within seed noise (paired {mean:+.2f} ± "
                    f"{error:.2f} s.e. over {seeds} seeds)"
                )
            else:
                failures.append(
                    f"{task}: {ours[0] - lso[0]:+.2f} points vs Keras LSO (paired {mean:+.2f} ± "
                    f"{error:.2f} s.e. over {seeds} seeds)"
                )
        parts.append(part)
    summary = "; ".join(parts) + (f"; missed: {'; '.join(failures)}" if failures else "")
    return Target(2, bool(parts) and not failures, summary, failures)


def target_skipped(runs: list[Run]) -> Target:
    """Target 3: at most 1 skipped step per 1,000 after the first 100 steps."""
    tasks = sorted({r.task for r in runs if r.method == OURS})
    rates = {t: skipped_per_1000(runs, t, OURS) for t in tasks}
    passed = bool(rates) and all(v <= 1.0 for v in rates.values())
    summary = ", ".join(f"{t} {v:.2f}/1000" for t, v in rates.items()) + " after step 100"
    return Target(3, passed, summary)


STEP_LIMIT = 1.05
"""Target 4's step time ratio (issue 43; the benchmark issue asked 1.10)."""
MEMORY_LIMIT = 1.05
"""Target 5's XLA step memory ratio, the buffer assignment's total."""
MEMORY_PEAK_LIMIT = 1.02
"""Target 5's ratio of the bytes live at the step's busiest point (issue 43)."""


def growth_exponent(timings: list[Timing]) -> float:
    """Exponent k of overhead ~ layers**k: least-squares slope of log overhead
    against log layers over every sweep size with a positive overhead.

    All sizes, not only the two largest: there the overhead is a few percent
    of the step, within the noise between instances, and the slope between two
    such differences swung from "not measurable" to 1.22 between two runs.

    Returns NaN when the largest size's overhead is not positive (lost in the
    noise) or fewer than two sizes have a positive overhead.
    """
    ordered = sorted(timings, key=lambda t: t.layers)
    positive = [t for t in ordered if t.overhead_ms > 0]
    if not ordered or ordered[-1].overhead_ms <= 0 or len(positive) < 2:
        return float("nan")
    x = np.log([t.layers for t in positive])
    y = np.log([t.overhead_ms for t in positive])
    return float(np.polyfit(x, y, 1)[0])


def target_step_time(
    timings: list[Timing], sweep: list[Timing], limit: float = STEP_LIMIT
) -> Target:
    """Target 4: step time <= 1.05x Keras LSO (XLA); overhead grows at most linearly."""
    ours = [t for t in timings if t.method == OURS] + list(sweep)
    worst = max(ours, key=lambda t: t.ratio)
    exponent = growth_exponent(sweep) if len(sweep) >= 2 else float("nan")
    largest = max(sweep, key=lambda t: t.layers) if sweep else None
    if math.isnan(exponent):
        linear = largest is not None and largest.overhead_ms <= 0
        growth = "overhead not measurable at the largest sizes" if linear else "growth unknown"
    else:
        linear = exponent <= 1.1
        growth = f"overhead ~ layers^{exponent:.2f} (fit over the sweep)"
    fast = worst.ratio <= limit
    failures = [f"{t.model}: {_ratio(t)}" for t in ours if t.ratio > limit]
    summary = f"worst ratio {_ratio(worst)} ({worst.model}); {growth}"
    if failures:
        summary += f"; above {limit:.2f}x: {', '.join(failures)}"
    return Target(4, fast and linear, summary, failures)


def _ratio(timing: Timing) -> str:
    """`1.070x`, with ` ± 0.012` where its standard error is known."""
    error = "" if math.isnan(timing.ratio_se) else f" ± {timing.ratio_se:.3f}"
    return f"{timing.ratio:.3f}x{error}"


def memory_ratios(memory: list[Memory]) -> dict[str, tuple[float, float, float | None]]:
    """`model -> (XLA step memory ratio, peak RSS ratio, live-at-peak ratio or None)`,
    keras_als over Keras LSO; the last is None where XLA's peak usage was not read."""
    by = {(m.model, m.method): m for m in memory}
    ratios = {}
    for model in dict.fromkeys(m.model for m in memory):
        ours, theirs = by.get((model, OURS)), by.get((model, BASELINE))
        if ours and theirs:
            peaks = (ours.xla_peak_bytes, theirs.xla_peak_bytes)
            ratios[model] = (
                ours.xla_bytes / theirs.xla_bytes,
                ours.peak_rss_mb / theirs.peak_rss_mb,
                None if None in peaks else peaks[0] / peaks[1],
            )
    return ratios


def target_memory(
    memory: list[Memory], limit: float = MEMORY_LIMIT, peak_limit: float = MEMORY_PEAK_LIMIT
) -> Target:
    """Target 5: XLA step memory <= 1.05x Keras LSO in total and <= 1.02x live at
    its peak (where the peak was read; a model without it fails: not measured)."""
    ratios = memory_ratios(memory)
    failures = [
        model
        for model, (total, _, peak) in ratios.items()
        if total > limit or peak is None or peak > peak_limit
    ]
    passed = bool(ratios) and not failures
    summary = ", ".join(
        f"{model} step {total:.3f}x, at peak "
        f"{'not read' if peak is None else f'{peak:.3f}x'} (process peak RSS {rss:.3f}x)"
        for model, (total, rss, peak) in ratios.items()
    )
    return Target(5, passed, summary, failures)


def targets(
    measurements: list[Measurement],
    hard: set[str],
    runs: list[Run],
    timings: list[Timing],
    sweep: list[Timing],
    memory: list[Memory],
) -> list[Target]:
    """All five targets, in order."""
    return [
        target_fidelity(measurements, hard),
        target_accuracy(runs),
        target_skipped(runs),
        target_step_time(timings, sweep),
        target_memory(memory),
    ]


def judge(results: dict) -> list[Target]:
    """All five targets of a suite run's results (the command's, or results.json loaded)."""
    return targets(
        results["measurements"],
        results["hard"],
        results["runs"],
        results["timings"],
        results["sweep"],
        results["memory"],
    )
