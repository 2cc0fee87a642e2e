"""The verdict per setting, and heavy_tails.md."""

from __future__ import annotations

import dataclasses
import math
import statistics

from benchmarks.harness import stats
from benchmarks.heavy_tails.plan import (
    BASELINE,
    METHOD_LABELS,
    METHODS,
    OURS,
    Setting,
    setting_named,
)
from benchmarks.heavy_tails.training import Run

TIE_SEEDS = 5
"""Fewest paired seeds for a shortfall within two standard errors to count as a tie."""
SKIP_SHARE = 0.005
"""Skipped steps keras_als may have regardless of Keras LSO's: 0.5% of the steps."""


def paired(runs: list[Run], setting: str) -> tuple[float, float, int]:
    """keras_als's outcome minus Keras LSO's, paired by seed: `(mean, s.e., seeds)`.

    Accuracy in points; loss as it is. A seed where either outcome is NaN counts
    as NaN (the mean is NaN).
    """
    scale = 1.0 if setting_named(setting).outcome == "loss" else 100.0
    ours = {r.seed: r.outcome for r in runs if r.setting == setting and r.method == OURS}
    theirs = {r.seed: r.outcome for r in runs if r.setting == setting and r.method == BASELINE}
    return stats.paired_by_seed(ours, theirs, scale)


@dataclasses.dataclass
class Verdict:
    """The target on one setting."""

    setting: str
    passed: bool
    skips: str
    outcome: str

    def line(self) -> str:
        return f"{self.setting}: {'PASS' if self.passed else 'FAIL'} - {self.skips}; {self.outcome}"


def judge(runs: list[Run], setting: str) -> Verdict:
    """Skipped steps at most max(2x Keras LSO's, 0.5% of the steps), pooled over
    seeds; outcome no worse than Keras LSO's, or within two standard errors over
    at least `TIE_SEEDS` paired seeds."""
    mine = [r for r in runs if r.setting == setting and r.method == OURS]
    theirs = [r for r in runs if r.setting == setting and r.method == BASELINE]
    ours_skipped = sum(r.skipped for r in mine)
    their_skipped = sum(r.skipped for r in theirs)
    steps = sum(r.steps for r in mine)
    allowed = max(2 * their_skipped, SKIP_SHARE * steps)
    skips_ok = bool(mine) and ours_skipped <= allowed
    skips = (
        f"skipped {ours_skipped} of {steps} steps vs Keras LSO {their_skipped} "
        f"(allowed {allowed:g}: {'ok' if skips_ok else 'too many'})"
    )
    mean, error, seeds = paired(runs, setting)
    lower_is_better = setting_named(setting).outcome == "loss"
    worse = mean if lower_is_better else -mean  # > 0: keras_als worse
    unit = "" if lower_is_better else " points"
    what = "held-out MSE" if lower_is_better else "held-out accuracy"
    text = f"{what} paired {mean:+.4g} ± {error:.2g}{unit} s.e. over {seeds} seeds"
    if math.isnan(mean):
        outcome_ok, text = False, text + " (not finite)"
    elif worse <= 0:
        outcome_ok, text = True, text + " (no worse than Keras LSO)"
    elif seeds >= TIE_SEEDS and worse - 2 * error <= 0:
        outcome_ok, text = True, text + " (worse, but within two s.e.: a tie within seed noise)"
    else:
        outcome_ok = False
        text += " (worse than Keras LSO" + (
            ")" if seeds >= TIE_SEEDS else f"; fewer than {TIE_SEEDS} seeds to call a tie)"
        )
    return Verdict(setting, skips_ok and outcome_ok, skips, text)


def table(runs: list[Run], setting: Setting) -> list[str]:
    """The markdown table of one setting: one row per method."""
    mine = [r for r in runs if r.setting == setting.name]
    seeds = sorted({r.seed for r in mine})
    loss = setting.outcome == "loss"
    outcome = "held-out MSE (mean ± sd)" if loss else "held-out accuracy % (mean ± sd)"
    steps = mine[0].steps if mine else 0
    lines = [
        f"### {setting.name}: {setting.description}",
        "",
        f"{steps} steps per run, {len(seeds)} seeds ({', '.join(map(str, seeds))}); a step "
        f"is skipped where its gradients were not finite; {mine[0].spike_batches if mine else 0} "
        "of the steps hold a spiked sample.",
        "",
        f"| method | {outcome} | skipped steps per run (mean, min-max) "
        "| of them in spike batches | runs with non-finite weights | seconds per run |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method in METHODS:
        rs = [r for r in mine if r.method == method]
        if not rs:
            continue
        values = [r.outcome * (1.0 if loss else 100.0) for r in rs]
        skipped = [r.skipped for r in rs]
        in_spikes = sum(r.skipped_in_spike_batches for r in rs)
        lines.append(
            f"| {METHOD_LABELS[method]} | {stats.mean_sd(values, 4 if loss else 2)} "
            f"| {statistics.fmean(skipped):.1f} ({min(skipped)}-{max(skipped)}) "
            f"| {in_spikes} of {sum(skipped)} "
            f"| {sum(not r.finite_weights for r in rs)} of {len(rs)} "
            f"| {statistics.fmean(r.seconds for r in rs):.1f} |"
        )
    mean, error, n = paired(runs, setting.name)
    unit = "" if setting.outcome == "loss" else " points"
    lines += [
        "",
        f"Paired by seed, keras_als minus Keras LSO: {mean:+.4g} ± {error:.2g}{unit} "
        f"(mean ± s.e. over {n} seeds).",
    ]
    return lines


def telemetry_lines(runs: list[Run], setting: Setting) -> list[str]:
    """Where keras_als skipped and what it learned: per-layer telemetry over seeds."""
    rs = [r for r in runs if r.setting == setting.name and r.method == OURS]
    lso = [r for r in runs if r.setting == setting.name and r.method == BASELINE]
    if not rs:
        return []
    first_100 = sum(sum(1 for s in r.skipped_at if s < 100) for r in rs)
    lines = [
        "",
        f"keras_als telemetry at the end ({len(rs)} seeds): skipped steps "
        f"{[r.skipped for r in rs]} (its own counter {[r.skipped_steps for r in rs]}), "
        f"{first_100} of them in the first 100 steps; recent skip rate "
        f"{[round(r.telemetry.get('recent_skip_rate', 0.0), 3) for r in rs]}; "
        f"Keras LSO skipped at steps {[r.skipped_at for r in lso]}, ending at scale "
        f"{sorted({r.scale for r in lso})}.",
        "",
        "| component | scale (median) | headroom, binades (per seed) | overflows started "
        "(per seed) | last overflow step (per seed) | underflow rate (mean) | zero rate (mean) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in rs[0].telemetry.get("scale", {}):
        t = [r.telemetry for r in rs]
        lines.append(
            f"| {name} | 2^{statistics.median(math.log2(x['scale'][name]) for x in t):g} "
            f"| {[x['headroom'][name] for x in t]} | {[x['overflows'][name] for x in t]} "
            f"| {[x['last_overflow_step'][name] for x in t]} "
            f"| {statistics.fmean(x['underflow_rate'][name] for x in t):.2g} "
            f"| {statistics.fmean(x['zero_rate'][name] for x in t):.2g} |"
        )
    return lines


def markdown(results: dict) -> str:
    """heavy_tails.md from the results."""
    runs = results["runs"]
    lines = [
        "# Heavy-tailed losses (issue 17)",
        "",
        f"Generated by `{results['command']}` (never edit by hand). Settings, methods "
        "and the target: the docstring of `benchmarks/heavy_tails/__init__.py` and "
        "`benchmarks/README.md`.",
        "",
        f"- Date: {results['date']}; total {results['seconds']:.0f} s (load average "
        f"{results['load_average'][0]:.1f} at the start, {results['load_average'][1]:.1f} "
        "at the end: other jobs share the machine)",
        f"- Machine: {results['environment']}",
        f"- keras_als measured: {results['provenance']}",
        "",
        "Target per setting: keras_als's skipped steps (pooled over seeds) at most "
        "max(2x Keras LSO's, 0.5% of the steps), and its held-out outcome no worse than "
        "Keras LSO's within seed noise (paired by seed, two standard errors, at least 5 seeds).",
        "",
    ]
    if results["quick"]:
        lines += [
            "Quick run: one seed and shorter training, to check that the benchmark works; "
            "its verdicts cannot call a tie and say nothing (see the full run).",
            "",
        ]
    for verdict in results["verdicts"]:
        lines.append(f"- {verdict.line()}")
    for setting in results["settings"]:
        lines += [""] + table(runs, setting) + telemetry_lines(runs, setting)
    return "\n".join(lines) + "\n"
