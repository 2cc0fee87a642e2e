"""The tables of the two studies, and their comparisons paired by seed (pure functions)."""

from __future__ import annotations

import dataclasses
import math
import statistics

from benchmarks.harness import scaling, stats
from benchmarks.keras_hub_tasks.training import METHODS, Run
from benchmarks.real_models.report import COMPILE_TARGET, STEP_TARGET

OURS, BASELINE = scaling.ALS_MAX_SAFE.name, scaling.KERAS_LSO.name


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How a study's outcome reads: its name, its unit's factor, and its direction."""

    name: str
    factor: float
    unit: str
    lower_is_better: bool
    digits: int


MAP = Outcome("held-out mAP@0.5", 100.0, " points", lower_is_better=False, digits=2)
HELD_OUT_LOSS = Outcome("held-out loss (nats per byte)", 1.0, "", lower_is_better=True, digits=4)
SECTIONS = {
    "retinanet": ("KerasHub RetinaNet on pasted digits (issue 40)", MAP),
    "lora": (
        "LoRA fine-tuning of a KerasHub Gemma causal LM on the standard library's docstrings "
        "(issue 40)",
        HELD_OUT_LOSS,
    ),
}
"""Each study's section title and outcome."""


def table(runs: list[Run], outcome: Outcome, methods: tuple[scaling.Method, ...]) -> list[str]:
    """One row per method: outcome, final loss, skips, non-finite runs, step and compile time."""
    lines = [
        f"| method | {outcome.name} (mean ± sd) | final training loss (mean ± sd) | "
        "skipped steps per run (mean, min-max) | runs with non-finite weights | "
        "step ms (mean) | compile s (mean) | scales |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for method in methods:
        mine = [r for r in runs if r.method == method.name]
        if not mine:
            continue
        skipped = [r.skipped for r in mine]
        lines.append(
            f"| {method.label} "
            f"| {stats.mean_sd([outcome.factor * r.outcome for r in mine], outcome.digits)} "
            f"| {stats.mean_sd([r.final_loss for r in mine], 4)} "
            f"| {statistics.fmean(skipped):.1f} ({min(skipped)}-{max(skipped)}) "
            f"| {sum(not r.finite_weights for r in mine)} of {len(mine)} "
            f"| {1000 * statistics.fmean(r.step_seconds for r in mine):.1f} "
            f"| {statistics.fmean(r.compile_seconds for r in mine):.1f} "
            f"| {mine[0].scales} |"
        )
    return lines


def _by_seed(runs: list[Run], method: str, value) -> dict:
    return {r.seed: value(r) for r in runs if r.method == method}


def ratio(runs: list[Run], value) -> tuple[float, float, int]:
    """keras_als's `value` over Keras LSO's, per seed: `(mean, s.e., seeds)`."""
    ours, theirs = _by_seed(runs, OURS, value), _by_seed(runs, BASELINE, value)
    ratios = [ours[s] / theirs[s] for s in sorted(ours) if s in theirs]
    return (*stats.mean_and_standard_error(ratios), len(ratios))


def comparisons(runs: list[Run], outcome: Outcome) -> list[str]:
    """keras_als against Keras LSO, paired by seed: outcome difference, skips, time ratios."""
    mean, error, seeds = stats.paired_by_seed(
        _by_seed(runs, OURS, lambda r: r.outcome),
        _by_seed(runs, BASELINE, lambda r: r.outcome),
        outcome.factor,
    )
    if math.isnan(mean):
        verdict = "not finite"
    else:
        worse = mean > 0 if outcome.lower_is_better else mean < 0
        within = abs(mean) <= 2 * error if math.isfinite(error) else False
        verdict = (
            "a tie within two standard errors"
            if within
            else ("worse than" if worse else "better than") + " Keras LSO's"
        )
    step = ratio(runs, lambda r: sum(r.block_seconds[1:]))
    compile_ = ratio(runs, lambda r: r.compile_seconds)
    ours = sum(r.skipped for r in runs if r.method == OURS)
    theirs = sum(r.skipped for r in runs if r.method == BASELINE)
    return [
        f"Paired by seed, keras_als against Keras LSO ({seeds} seeds, mean ± standard error):",
        "",
        f"- {outcome.name}: keras_als minus Keras LSO {mean:+.4g} ± {error:.2g}{outcome.unit} "
        f"({verdict}).",
        f"- skipped steps, all seeds: keras_als {ours}, Keras LSO {theirs}.",
        f"- step time: keras_als / Keras LSO {step[0]:.3f}x ± {step[1]:.3f} (each seed: the "
        "total wall time of its compiled blocks, interleaved in one process).",
        f"- compile time (the first block's extra time): {compile_[0]:.3f}x ± {compile_[1]:.3f}.",
        "",
        "Issue 43's targets (the real models' limits):",
        "",
        target_line("step time", step, STEP_TARGET),
        target_line("compile time", compile_, COMPILE_TARGET),
    ]


def target_line(name: str, ratio: tuple[float, float, int], limit: float) -> str:
    """`Target <name> <= <limit>x: PASS|FAIL`, and whether the ratio lies within two
    standard errors of the limit (then more seeds could still tell)."""
    mean, error, _ = ratio
    verdict = "PASS" if mean <= limit else "FAIL"
    if math.isfinite(error) and abs(mean - limit) <= 2 * error:
        verdict += ", within two standard errors of the limit"
    return f"- Target {name} <= {limit:.2f}x: {verdict} ({mean:.3f}x ± {error:.3f})."


def markdown(results: dict) -> str:
    """A study's section from its results: provenance, the table, the paired comparisons."""
    title, outcome = SECTIONS[results["study"]]
    runs = [Run(**r) for r in results["runs"]]
    before = results.get("pretrained_held_out_loss")
    extra = []
    if before:
        extra = [
            "",
            "Before fine-tuning, the pretrained model's held-out loss: "
            f"{statistics.fmean(before):.4f} (mean over seeds).",
        ]
    lines = [
        f"# {title}",
        "",
        f"Generated by `{results['command']}` (never edit by hand). The plan: the docstring "
        f"of `benchmarks/keras_hub_tasks/{results['study']}.py`.",
        "",
        f"- Date: {results['date']}; total {results['seconds']:.0f} s (load average "
        f"{results['load_average'][0]:.1f} at the start, {results['load_average'][1]:.1f} "
        "at the end)",
        f"- Machine: {results['environment']}",
        f"- keras_als measured: {results['provenance']}",
        f"- Steps: {runs[0].steps} per run; "
        + ", ".join(f"{k.lower().replace('_', ' ')} {v}" for k, v in results["settings"].items()),
        "",
        *table(runs, outcome, METHODS),
        "",
        *comparisons(runs, outcome),
        *extra,
    ]
    return "\n".join(lines) + "\n"
