"""A detection-shaped benchmark: an SSD-like model on digits pasted into canvases.

The study's command line (`python -m benchmarks.detection --help`; the plan:
the package docstring): runs the plan, or its quick version, or the float32
learning-rate sweep, and writes detection.json and detection.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

from benchmarks.detection.canvases import CANVAS
from benchmarks.detection.plan import (
    BATCH,
    LEARNING_RATES,
    METHODS,
    QUICK_METHODS,
    QUICK_STEPS,
    SEEDS,
    STEPS,
    run_plan,
    sweep,
)
from benchmarks.detection.report import markdown, table


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.detection", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, Adam only, 4 methods")
    parser.add_argument("--seeds", type=int, help=f"seeds 0..N-1 (default {len(SEEDS)})")
    parser.add_argument("--sweep", action="store_true", help="the float32 learning-rate sweep")
    parser.add_argument("--out", help="output folder (default benchmarks/results[/quick])")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    if args.sweep:
        sweep()
        print(f"sweep: {time.perf_counter() - start:.0f} s")
        return 0
    if args.quick:
        methods = tuple(m for m in METHODS if m.name in QUICK_METHODS)
        optimizers, seeds, steps = ("adam",), SEEDS[:1], QUICK_STEPS
    else:
        methods, optimizers, seeds, steps = METHODS, ("sgd", "adam"), SEEDS, STEPS
    if args.seeds:
        seeds = tuple(range(args.seeds))
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = args.out or os.path.join(here, "results", "quick" if args.quick else "")
    os.makedirs(folder, exist_ok=True)
    command = "python -m benchmarks.detection" + " ".join(
        [""]
        + (["--quick"] if args.quick else [])
        + ([f"--seeds {args.seeds}"] if args.seeds else [])
    )
    settings = {
        "canvas": CANVAS,
        "batch": BATCH,
        "steps": steps,
        "learning_rates": {k: LEARNING_RATES[k] for k in optimizers},
        "optimizers": {"sgd": "SGD momentum 0.9", "adam": "Adam"},
    }
    print(
        f"== {command}: {len(methods)} methods x {optimizers} x seeds {list(seeds)}, {steps} steps"
    )
    runs = run_plan(methods, optimizers, seeds, steps)
    seconds = time.perf_counter() - start
    with open(os.path.join(folder, "detection.json"), "w") as f:
        json.dump(
            {
                "command": command,
                "seconds": seconds,
                "settings": settings,
                "runs": [dataclasses.asdict(r) for r in runs],
            },
            f,
            indent=1,
        )
    with open(os.path.join(folder, "detection.md"), "w") as f:
        f.write(markdown(runs, command, seconds, settings))
    print()
    print(table(runs))
    print(f"\nWrote {folder}/detection.md and detection.json in {seconds:.0f} s")
    return 0
