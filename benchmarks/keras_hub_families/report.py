"""The sweep's verdicts and table (pure functions of the result rows)."""

from __future__ import annotations

import math
import re
import statistics

FLOAT32, NONE, KERAS, OURS, FALLBACK = (
    "float32",
    "mixed_no_scaling",
    "keras_lso",
    "als_max_safe",
    "als_fallback",
)
RELATIVE = 0.02
"""The noise's floor, relative to float32's held-out loss."""

_QWEN = (
    "one step skipped on seed 1 (step 30), none by Keras's optimizer. "
    "`python -m benchmarks.keras_hub_families.skips --family qwen --seed 1` shows where the "
    "overflow started: in the decoder's residual group (the stream and the branches it feeds "
    "form one cycle), whose attention and MLP boundaries keras_als held at 2^17 to "
    "2^20, above Keras's one 2^15 (the stream itself at 2^13). "
    "`MaxSafe` sets a scale from the largest crossing gradient with 2^6 of margin, "
    "so a value in their backward pass reached more than 64 times the largest crossing "
    "gradient of the step before: with the scales measured "
    "on every step (`--measure-every-n-steps 1`) the same step is skipped. A scale set "
    "from past gradients cannot foresee that growth; the overflow gives those components "
    "headroom, no later step is skipped, and the held-out loss is within the seed noise "
    "of float32's."
)
EXPLAINED = {
    "qwen": _QWEN,
    "qwen2": (
        "as qwen's: KerasHub's Qwen2 classes are Qwen's "
        "(`keras_hub.models.Qwen2Backbone is keras_hub.models.QwenBackbone`), "
        "so the runs are equal."
    ),
    "basnet": (
        "no verdict: float32 itself did not finish its 40 steps in 3000 s on this 2-core "
        "CPU (KerasHub's BASNet refinement head holds 51 million weights at any size)."
    ),
}
"""Why a family did not pass, said after its runs (`verdict` is not *pass*)."""


def _of(rows: list[dict], family: str, method: str) -> list[dict]:
    return sorted(
        (r for r in rows if r["family"] == family and r["method"] == method),
        key=lambda r: r["seed"],
    )


def noise(float32_losses: list[float]) -> float:
    """Seed noise: `max(2 * |a - b|, 2% of their mean)` for two seeds' float32
    held-out losses; the 2% alone for one seed."""
    mean = statistics.fmean(float32_losses)
    spread = 2 * (max(float32_losses) - min(float32_losses)) if len(float32_losses) > 1 else 0.0
    return max(spread, RELATIVE * abs(mean))


def _mean(rows: list[dict]) -> float:
    values = [r["outcome"] for r in rows]
    return statistics.fmean(values) if values else math.nan


def verdict(rows: list[dict], family: str) -> str:
    """`pass`, `fail: ...` with the reasons, or no verdict: `timed out` (the
    cost rule stopped it), `float32 fails`, or `float16 fails` (every
    mixed_float16 method raised, Keras's too)."""
    reference = _of(rows, family, FLOAT32)
    if any((r.get("error") or "").startswith("timed out") for r in reference):
        return "timed out"
    if not reference or any(r.get("error") or not math.isfinite(r["outcome"]) for r in reference):
        return "float32 fails"
    mixed = [_of(rows, family, m) for m in (NONE, KERAS, OURS, FALLBACK)]
    if all(runs and any(r.get("error") for r in runs) for runs in mixed):
        return "float16 fails"
    ours = _of(rows, family, FALLBACK)
    keras = {r["seed"]: r for r in _of(rows, family, KERAS)}
    if not ours or any(r.get("error") for r in ours):
        return "fail: keras_als + Float32Fallback raised"
    reasons = []
    gap = _mean(ours) - _mean(reference)
    if not math.isfinite(gap):
        reasons.append("loss not finite")
    elif gap > (tolerance := noise([r["outcome"] for r in reference])):
        reasons.append(f"loss {gap:+.3g} beyond noise {tolerance:.3g}")
    more = [
        r["seed"]
        for r in ours
        if r["seed"] in keras
        and keras[r["seed"]]["skipped"] is not None
        and r["skipped"] > keras[r["seed"]]["skipped"]
    ]
    if more:
        reasons.append(f"skips more than Keras's on seeds {more}")
    return "fail: " + "; ".join(reasons) if reasons else "pass"


def _loss(rows: list[dict]) -> str:
    if not rows:
        return "not run"
    if any(r.get("error") for r in rows):
        return "error"
    values = [r["outcome"] for r in rows]
    if not all(math.isfinite(v) for v in values):
        finite = sum(math.isfinite(v) for v in values)
        return f"not finite ({len(values) - finite} of {len(values)})"
    return f"{statistics.fmean(values):.3f}"


def _skips(rows: list[dict]) -> str:
    if not rows or any(r.get("skipped") is None for r in rows):
        return "-"
    return "/".join(str(r["skipped"]) for r in rows)


def _moved(rows: list[dict]) -> str:
    applied = [paths for r in rows for _, paths in r.get("fallback_applied") or []]
    layers = sorted({p for paths in applied for p in paths})
    if not layers:
        return "none"
    shown = ", ".join(f"`{p}`" for p in layers[:3])
    return f"{len(layers)}: {shown}" + (", ..." if len(layers) > 3 else "")


def families_in(rows: list[dict], order: list[str]) -> list[str]:
    """The families of `rows`, in `order` (then any others)."""
    present = {r["family"] for r in rows}
    return [f for f in order if f in present] + sorted(present - set(order))


def table(rows: list[dict], order: list[str]) -> list[str]:
    """One line a family: held-out losses (mean over seeds), skips per seed, verdict."""
    lines = [
        "| family | seeds | float32 | no scaling | Keras LSO (loss, skipped) | keras_als "
        "(loss, skipped) | keras_als + Float32Fallback (loss, skipped, layers moved) | verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for family in families_in(rows, order):

        def of(method, family=family):
            return _of(rows, family, method)

        seeds = ",".join(str(r["seed"]) for r in of(FLOAT32))
        lines.append(
            f"| {family} | {seeds} | {_loss(of(FLOAT32))} | {_loss(of(NONE))} "
            f"| {_loss(of(KERAS))}, {_skips(of(KERAS))} | {_loss(of(OURS))}, {_skips(of(OURS))} "
            f"| {_loss(of(FALLBACK))}, {_skips(of(FALLBACK))}, {_moved(of(FALLBACK))} "
            f"| {verdict(rows, family)} |"
        )
    return lines


def errors(rows: list[dict], order: list[str]) -> list[str]:
    """One line for each family and method that raised: its first error."""
    lines = []
    for family in families_in(rows, order):
        for method in (FLOAT32, NONE, KERAS, OURS, FALLBACK):
            failed = [r for r in _of(rows, family, method) if r.get("error")]
            if failed:
                seeds = ",".join(str(r["seed"]) for r in failed)
                error = re.sub(r"\x1b\[[0-9;]*m|\s+(?=\s)", "", failed[0]["error"])[:160]
                lines.append(f"- {family}, {method} (seeds {seeds}): {error}")
    return lines


def counts(rows: list[dict], order: list[str]) -> dict[str, int]:
    """How many families got each verdict (`fail: ...` counted as `fail`)."""
    out: dict[str, int] = {}
    for family in families_in(rows, order):
        key = verdict(rows, family).split(":")[0]
        out[key] = out.get(key, 0) + 1
    return out


def not_run(pairs: list[str], families: int) -> str:
    """`"bert (seed 2)"`-like pairs, grouped by seed; `every family` where all
    `families` are."""
    by_seed: dict[str, list[str]] = {}
    for pair in pairs:
        name, seed = pair.rstrip(")").split(" (seed ")
        by_seed.setdefault(seed, []).append(name)
    return "; ".join(
        f"seed {seed}: " + ("every family" if len(names) >= families else ", ".join(names))
        for seed, names in by_seed.items()
    )


def markdown(results: dict, order: list[str]) -> str:
    """The sweep's section of RESULTS.md."""
    rows = results["runs"]
    tally = counts(rows, order)
    tally_families = families_in(rows, order)
    lines = [
        "# Every KerasHub family, tiny, under each method (issue 80)",
        "",
        f"Generated by `{results['command']}` (never edit by hand). The plan, the data, the "
        "seed noise and the verdict: the docstring of `benchmarks/keras_hub_families/__init__.py`.",
        "",
        f"- Date: {results['date']}; total {results['seconds']:.0f} s",
        f"- Machine: {results['environment']}",
        f"- keras_als measured: {results['provenance']}",
        *(
            f"- Kept: {k['runs']} family-seed pairs measured by `{k['command']}` ({k['date']}; "
            + (f"keras_als {k['code']})" if k.get("code") else "keras_als code not recorded)")
            for k in results.get("kept", [])
        ),
        "- Verdicts: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())),
        *(
            [f"- Not run (time budget): {not_run(results['not_run'], len(tally_families))}"]
            if results.get("not_run")
            else []
        ),
        "",
        "Held-out loss, mean over the seeds run; skipped steps per seed (of 40). *pass*: "
        "keras_als + `Float32Fallback`'s loss within the seed noise of float32's (or below) "
        "and no seed skipping more steps than Keras's `LossScaleOptimizer`.",
        "",
        *table(rows, order),
    ]
    explained = [
        f"- **{family}**: {EXPLAINED[family]}"
        for family in families_in(rows, order)
        if family in EXPLAINED and verdict(rows, family) != "pass"
    ]
    if explained:
        lines += ["", "The families that did not pass, explained:", "", *explained]
    failed = errors(rows, order)
    if failed:
        lines += ["", "Errors (the first of each family and method):", "", *failed]
    return "\n".join(lines) + "\n"
