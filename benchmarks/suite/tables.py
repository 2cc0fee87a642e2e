"""The markdown tables of RESULTS.md, from measured results (pure functions)."""

from __future__ import annotations

import math

from benchmarks.suite.convergence import Run
from benchmarks.suite.fidelity import Measurement
from benchmarks.suite.records import Memory, Timing
from benchmarks.suite.targets import (
    BASELINE,
    OURS,
    accuracy_summary,
    fmt,
    layer_mean_error,
    memory_ratios,
    paired_difference,
    skipped_per_1000,
)


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def fidelity_tables(measurements: list[Measurement], hard: set[str]) -> str:
    """Layer-mean error, worst-layer error and underflow: rows case/phase, columns methods."""
    methods = list(dict.fromkeys(m.method for m in measurements))
    keys = list(dict.fromkeys((m.case, m.phase) for m in measurements))
    by = {(m.case, m.phase, m.method): m for m in measurements}
    out = []
    metrics = (
        ("Gradient error, mean over layers", lambda m: fmt(layer_mean_error(m))),
        ("Gradient error, worst layer", lambda m: fmt(m.worst_layer_error)),
        ("Gradient error, all gradients concatenated", lambda m: fmt(m.error)),
        ("Underflow rate, all gradient elements", lambda m: f"{m.underflow:.4f}"),
        ("Steps skipped before the measurement (settle / training)", lambda m: str(m.skipped)),
    )
    for title, cell in metrics:
        rows = []
        for case, phase in keys:
            name = f"{case}{' (hard)' if case in hard else ''}"
            rows.append(
                [name, phase]
                + [cell(by[(case, phase, m)]) if (case, phase, m) in by else "" for m in methods]
            )
        out.append(f"#### {title}\n\n" + _table(["model", "phase", *methods], rows))
    return "\n\n".join(out)


def fidelity_summary(measurements: list[Measurement], hard: set[str]) -> str:
    """keras_als (max_safe) against Keras LSO only: error and underflow per model and phase."""
    by = {(m.case, m.phase, m.method): m for m in measurements}
    rows = []
    for case, phase in dict.fromkeys((m.case, m.phase) for m in measurements):
        theirs, ours = by.get((case, phase, BASELINE)), by.get((case, phase, OURS))
        if theirs is None or ours is None:
            continue
        rows.append(
            [
                f"{case}{' (hard)' if case in hard else ''}",
                phase,
                fmt(layer_mean_error(theirs)),
                fmt(layer_mean_error(ours)),
                fmt(theirs.worst_layer_error),
                fmt(ours.worst_layer_error),
                f"{theirs.underflow:.4f}",
                f"{ours.underflow:.4f}",
            ]
        )
    header = [
        "model",
        "phase",
        "error LSO",
        "error keras_als",
        "worst layer LSO",
        "worst layer keras_als",
        "underflow LSO",
        "underflow keras_als",
    ]
    return _table(header, rows)


def _paired(runs: list[Run], task: str, method: str) -> str:
    """Mean ± standard error over seeds of accuracy(method) - accuracy(Keras LSO)."""
    mean, error, seeds = paired_difference(runs, task, method)
    return f"{mean:+.2f} ± {error:.2f} ({seeds})" if seeds else ""


def convergence_table(runs: list[Run]) -> str:
    """Accuracy mean ± standard deviation (seeds), the paired difference from Keras LSO
    and skipped steps per 1,000, per task and method."""
    acc = accuracy_summary(runs)
    methods = list(dict.fromkeys(r.method for r in runs))
    rows = []
    for task in dict.fromkeys(r.task for r in runs):
        steps = max(r.steps for r in runs if r.task == task)
        rows.append(
            [f"{task} accuracy % ({steps} steps)"]
            + [
                f"{acc[(task, m)][0]:.2f} ± {acc[(task, m)][1]:.2f} ({acc[(task, m)][2]})"
                if (task, m) in acc
                else ""
                for m in methods
            ]
        )
        rows.append(
            [f"{task} minus Keras LSO, paired by seed (points ± s.e., seeds)"]
            + [_paired(runs, task, m) for m in methods]
        )
        rows.append(
            [f"{task} skipped / 1000 after step 100"]
            + [f"{skipped_per_1000(runs, task, m):.2f}" for m in methods]
        )
        rows.append(
            [f"{task} skipped in all (sum over seeds)"]
            + [
                str(sum(r.skipped for r in runs if r.task == task and r.method == m))
                for m in methods
            ]
        )
    return _table(["task", *methods], rows)


_TIMING_COLUMNS = {
    "model": lambda t: t.model,
    "variant": lambda t: t.method,
    "wrapped layers": lambda t: str(t.layers),
    "Keras LSO ms": lambda t: f"{t.lso_ms:.2f}",
    "variant ms": lambda t: f"{t.als_ms:.2f}",
    "keras_als ms": lambda t: f"{t.als_ms:.2f}",
    "ratio": lambda t: (
        f"{t.ratio:.3f}" + ("" if math.isnan(t.ratio_se) else f" ± {t.ratio_se:.3f}")
    ),
    "LSO spread": lambda t: f"{t.lso_spread:.3f}",
    "overhead ms": lambda t: f"{t.overhead_ms:.3f}",
    "overhead per layer µs": lambda t: f"{1e3 * t.overhead_ms / t.layers:.1f}",
    "instances x rounds x steps": lambda t: f"{t.instances} x {t.blocks} x {t.steps_per_block}",
}
"""How each column of the timing tables is read off a `Timing`."""


def _timing_table(timings: list[Timing], columns: str) -> str:
    header = columns.split(", ")
    return _table(header, [[_TIMING_COLUMNS[c](t) for c in header] for t in timings])


def cost_table(timings: list[Timing]) -> str:
    """Interleaved step times (XLA) of keras_als variants against Keras LSO."""
    return _timing_table(
        timings,
        "model, variant, wrapped layers, Keras LSO ms, variant ms, ratio, LSO spread, "
        "instances x rounds x steps",
    )


def sweep_table(sweep: list[Timing]) -> str:
    """Overhead against the number of wrapped layers."""
    return _timing_table(
        sorted(sweep, key=lambda t: t.layers),
        "wrapped layers, Keras LSO ms, keras_als ms, ratio, LSO spread, overhead ms, "
        "overhead per layer µs, instances x rounds x steps",
    )


def memory_table(memory: list[Memory]) -> str:
    """XLA step memory and process RSS per model and method, with ratios."""
    ratios = memory_ratios(memory)
    by = {(m.model, m.method): m for m in memory}
    rows = []
    for model, (x, r, peak) in ratios.items():
        ours, theirs = by[(model, OURS)], by[(model, BASELINE)]
        rows.append(
            [
                model,
                f"{theirs.xla_bytes / 2**20:.3f}",
                f"{ours.xla_bytes / 2**20:.3f}",
                f"{x:.3f}",
                "not read" if peak is None else f"{peak:.3f}",
                f"{theirs.peak_rss_mb:.0f}",
                f"{ours.peak_rss_mb:.0f}",
                f"{r:.3f}",
                f"{theirs.rss_growth_mb:.0f} / {ours.rss_growth_mb:.0f}",
            ]
        )
    header = [
        "model",
        "LSO step MiB",
        "keras_als step MiB",
        "step ratio",
        "step live-at-peak ratio",
        "LSO peak RSS MiB",
        "keras_als peak RSS MiB",
        "RSS ratio",
        "RSS growth MiB (LSO / keras_als)",
    ]
    return _table(header, rows)
