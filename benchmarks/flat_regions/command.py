"""The study's command line:
`python -m benchmarks.flat_regions [--quick] [--models ...] [--seeds ...]`.

Runs every seed of the plan (or those of `--seeds`) for each model in this
process, then writes `flat_regions.json` (every run, with those of other models
and seeds kept from the file before) and `flat_regions.md` (the section
RESULTS.md takes in).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

from benchmarks.flat_regions import plan, report
from benchmarks.harness import provenance


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.flat_regions", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 short blocks")
    parser.add_argument(
        "--models", nargs="+", choices=sorted(plan.MODELS), default=list(plan.MODELS)
    )
    parser.add_argument(
        "--seeds", nargs="+", type=int, help="of each model's plan (default: all of them)"
    )
    parser.add_argument("--out", help="output folder (default benchmarks/results[/quick])")
    args = parser.parse_args(argv)
    arguments = {k: v for k, v in plan.QUICK.items() if k != "seeds"} if args.quick else {}
    start = time.perf_counter()
    rows = []
    for model in args.models:
        seeds = plan.QUICK["seeds"] if args.quick else plan.MODELS[model].seeds
        unplanned = set(args.seeds or ()) - set(seeds)
        if unplanned:
            parser.error(f"--seeds {sorted(unplanned)} are not in {model}'s plan {seeds}")
        for seed in args.seeds or seeds:
            done = plan.run_seed(model, seed, **arguments)
            rows += done
            print(
                f"{model} seed {seed}: "
                + ", ".join(
                    f"{r['method']} {r['outcome']:.4g} ({r['skipped']} skipped)" for r in done
                ),
                flush=True,
            )
    results = {
        "study": "flat_regions",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": recorded_command(argv or sys.argv[1:]),
        "seconds": time.perf_counter() - start,
        "environment": provenance.environment(),
        "provenance": provenance.code(),
        "runs": rows,
    }
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = args.out or os.path.join(here, "results", "quick" if args.quick else "")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "flat_regions.json")
    results = kept_from_earlier(results, path, args.models, args.seeds)
    text = report.markdown(results)
    with open(os.path.join(folder, "flat_regions.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(folder, "flat_regions.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


def recorded_command(argv: list[str]) -> str:
    """The command that made the results, as anyone reruns it: without
    `--out` (where they were written changes no number)."""
    return provenance.recorded_command("benchmarks.flat_regions", argv)


def kept_from_earlier(
    results: dict, path: str, models: list[str], seeds: list[int] | None = None
) -> dict:
    """`results`, with the runs of the file at `path` (if any) that were not run
    now (other models, or other seeds than `seeds`) kept, and which command,
    date and keras_als code made those (`"kept"`: per model, its seeds), so
    that each model and seed can run in a process of its own."""
    if not os.path.exists(path):
        return results
    with open(path) as f:
        earlier = json.load(f)
    others = [
        r
        for r in earlier["runs"]
        if r["model"] not in models or (seeds is not None and r["seed"] not in seeds)
    ]
    if not others:
        return results
    kept = {(r["model"], r["seed"]) for r in others}
    sources = []
    for source in [
        *earlier.get("kept", []),  # what the earlier file itself kept
        {"command": earlier["command"], "date": earlier["date"]}
        | {"code": earlier.get("provenance", "unknown")},
    ]:
        for model in source.get("models", sorted({m for m, _ in kept})):
            credited = {s for m, s in kept if m == model and s in source.get("seeds", [s])}
            if credited:
                kept -= {(model, s) for s in credited}
                entry = {k: v for k, v in source.items() if k not in ("models", "seeds")}
                sources.append({"models": [model], "seeds": sorted(credited)} | entry)
    return results | {"runs": results["runs"] + others, "kept": sources}
