"""The mechanism's tables (pure functions of `mechanism.measure`'s results)."""

from __future__ import annotations

import math

from benchmarks.flat_regions import plan
from benchmarks.harness import provenance

LABELS = {m.name: m.label for m in plan.METHODS}
LOST_AT_LEAST = 0.01
"""A layer is listed when a method loses at least this share of its values,
or its float32 gradients leave float16's range at scale 1."""


def _binades(largest: float, smallest: float) -> str:
    return f"{math.log2(largest / smallest):.0f}" if smallest > 0 else "-"


def phase_table(model: dict, phase: str) -> list[str]:
    """The layers whose float32 gradients leave float16's range at scale 1, or
    of which a method loses at least `LOST_AT_LEAST` of the values; a line for
    the others; each method's scales, skips and whole share lost."""
    found = model["phases"][phase]
    methods = found["methods"]
    names = list(methods)
    lines = [
        "| layer | float32 largest | float32 smallest (not 0) | binades | above 65504 / below "
        "2^-24 | " + " | ".join(f"lost: {n}" for n in names) + " |",
        "| --- | --- | --- | --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    quiet = 0
    for layer, r in found["layers"].items():
        lost = [methods[n]["lost"][layer] for n in names]
        leaves = r["above"] > 0 or r["below"] > 0
        if not leaves and max(lost) < LOST_AT_LEAST:
            quiet += 1
            continue
        lines.append(
            f"| {layer} | {r['largest']:.2e} | {r['smallest']:.2e} "
            f"| {_binades(r['largest'], r['smallest'])} "
            f"| {100 * r['above']:.2f}% / {100 * r['below']:.2f}% | "
            + " | ".join(f"{100 * v:.1f}%" for v in lost)
            + " |"
        )
    lines.append(
        f"\n{quiet} other layers: float32's gradients within float16's range at scale 1, "
        f"every method loses less than {100 * LOST_AT_LEAST:.0f}% of their values."
    )
    for name in names:
        m = methods[name]
        scales = m["scales"]
        shown = "scales: none"
        if len(scales) == 1:
            shown = f"scale 2^{math.log2(scales[0]):.0f}"
        elif scales:
            shown = f"scales 2^{math.log2(scales[0]):.0f} to 2^{math.log2(scales[-1]):.0f}"
        extra = f"; float32 layers: {', '.join(m['float32_layers'])}" if m["float32_layers"] else ""
        lines.append(
            f"- {LABELS.get(name, name)}: {100 * m['lost_overall']:.1f}% of all values lost, "
            f"gradients {'finite' if m['finite'] else 'not finite'}, {shown}, "
            f"{m['skipped_while_training']} steps skipped before{extra}."
        )
    return lines


def measured(model: dict) -> str:
    """When and on which keras_als code `model` was measured: its own record,
    else (a run from before models carried one) said to be unknown."""
    if "code" in model:
        return f"{model['date']}; keras_als {model['code']}"
    return "in an earlier run of this command, on keras_als code it did not record"


def markdown(results: dict) -> str:
    """The mechanism's section: provenance, then per model and phase its table."""
    lines = provenance.header(
        results,
        "Flat regions: the mechanism per layer",
        "benchmarks/flat_regions/mechanism.py",
    )
    if results.get("kept"):
        lines.append(f"- Kept from an earlier run of this command: {', '.join(results['kept'])}")
    for model in results["models"]:
        for phase in ("start", "later"):
            when = (
                "initial weights"
                if phase == "start"
                else (f"float32's weights after {model['later_steps']} steps")
            )
            lines += ["", f"## {model['model']}, {phase} ({when})", ""]
            if phase == "start":
                lines += [f"Measured {measured(model)}.", ""]
            lines += phase_table(model, phase)
    return "\n".join(lines) + "\n"
