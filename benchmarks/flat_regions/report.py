"""The study's tables and its paired comparisons (pure functions of the results)."""

from __future__ import annotations

import math
import statistics

from benchmarks.flat_regions import plan
from benchmarks.harness import provenance, stats

FLOAT32, KERAS = "float32", "keras_lso"
OURS = ("als_max_safe", plan.CALIBRATED.name, plan.DIAGNOSED.name, plan.FALLBACK.name)


def _of(rows: list[dict], model: str, method: str) -> list[dict]:
    return [r for r in rows if r["model"] == model and r["method"] == method]


def table(rows: list[dict], model: str) -> list[str]:
    """One line per method: held-out loss and metric, skips, step time."""
    metric = plan.MODELS[model].metric
    lines = [
        f"| method | held-out loss (mean ± sd) | held-out {metric} (mean ± sd) | skipped steps "
        "(mean, min-max) | runs with non-finite loss | step ms (mean) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method in plan.METHODS:
        mine = _of(rows, model, method.name)
        if not mine:
            continue
        skipped = [r["skipped"] for r in mine]
        lines.append(
            f"| {method.label} | {stats.mean_sd([r['outcome'] for r in mine], 4)} "
            f"| {stats.mean_sd([r['metric'] for r in mine], 3)} "
            f"| {statistics.fmean(skipped):.1f} ({min(skipped)}-{max(skipped)}) "
            f"| {sum(not math.isfinite(r['outcome']) for r in mine)} of {len(mine)} "
            f"| {1000 * statistics.fmean(r['step_seconds'] for r in mine):.1f} |"
        )
    return lines


def _against(ours: dict, reference: dict, seeds: list[int]) -> str:
    """The paired difference of held-out losses on `seeds`, and its verdict."""
    mean, error, count = stats.paired_by_seed(
        {s: ours[s]["outcome"] for s in seeds}, {s: r["outcome"] for s, r in reference.items()}
    )
    verdict = "within two standard errors"
    if not (math.isfinite(error) and abs(mean) <= 2 * error):
        side = "lower (better)" if mean < 0 else "higher (worse)"
        verdict = f"{side} beyond two standard errors"
    return f"{mean:+.4f} ± {error:.4f} ({count} seeds, {verdict})"


def comparisons(rows: list[dict], model: str) -> list[str]:
    """Each keras_als method against float32 and Keras (held-out loss, skips), by seed."""
    lines = []
    reference = {r["seed"]: r for r in _of(rows, model, FLOAT32)}
    keras = {r["seed"]: r for r in _of(rows, model, KERAS)}
    for name in OURS:
        ours = {r["seed"]: r for r in _of(rows, model, name)}
        if not ours:
            continue
        early = sorted(s for s in ours if s in plan.SEEDS)
        more = [s for s in sorted(ours) if s in keras and ours[s]["skipped"] > keras[s]["skipped"]]
        paired = [s for s in ours if s in keras]
        lines.append(
            f"- {name}: held-out loss minus float32's {_against(ours, reference, list(ours))}"
            + (
                f" (the first plan's seeds {early[0]}-{early[-1]} alone: "
                f"{_against(ours, reference, early)})"
                if 0 < len(early) < len(ours)
                else ""
            )
            + (f", minus Keras's {_against(ours, keras, paired)}" if paired else "")
            + f"; skips more than Keras's on seeds: {more or 'none'}."
        )
    diagnosed = _of(rows, model, plan.DIAGNOSED.name)
    if diagnosed:
        named = statistics.fmean(len(r["float32_layers"]) for r in diagnosed)
        first = diagnosed[0]
        lines.append(
            f"- `keras_als.diagnose` named {named:.1f} layers a seed; seed {first['seed']}: "
            f"{', '.join(first['float32_layers']) or 'none'}."
        )
        seconds = statistics.fmean(r["diagnose_seconds"] for r in diagnosed)
        lines.append(f"- `diagnose`, `apply` and `calibrate` took {seconds:.1f} s a seed.")
    fallback = _of(rows, model, plan.FALLBACK.name)
    if fallback:
        done = [
            f"seed {r['seed']}: "
            + (", ".join(f"{len(p)} at step {s}" for s, p in r["fallback_applied"]) or "none")
            for r in fallback
        ]
        lines.append(f"- Layers `Float32Fallback` set to float32: {'; '.join(done)}.")
    return lines


def markdown(results: dict) -> str:
    """The study's section: provenance, then per model its table and comparisons."""
    rows = results["runs"]
    lines = provenance.header(
        results,
        "Vision transformers on images with flat regions (issue 66)",
        "benchmarks/flat_regions/plan.py",
    )
    for kept in results.get("kept", []):
        seeds = f" (seeds {', '.join(map(str, kept['seeds']))})" if "seeds" in kept else ""
        lines.append(
            f"- Runs of {', '.join(kept['models'])}{seeds} kept from `{kept['command']}` "
            f"({kept['date']}{'; keras_als ' + kept['code'] if 'code' in kept else ''})"
        )
    for model in plan.MODELS:
        if not any(r["model"] == model for r in rows):
            continue
        steps = next(r["steps"] for r in rows if r["model"] == model)
        lines += ["", f"## {model} ({steps} steps a run)", "", *table(rows, model), ""]
        lines += comparisons(rows, model)
    return "\n".join(lines) + "\n"
