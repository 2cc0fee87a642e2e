"""The study's command line: `python -m benchmarks.flat_regions [--quick] [--models ...]`.

Runs every seed of the plan for each model in this process, then writes
`flat_regions.json` (every run) and `flat_regions.md` (the section RESULTS.md
takes in).
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
    parser.add_argument("--out", help="output folder (default benchmarks/results[/quick])")
    args = parser.parse_args(argv)
    settings = plan.QUICK if args.quick else {"seeds": plan.SEEDS}
    arguments = {k: v for k, v in settings.items() if k != "seeds"}
    start = time.perf_counter()
    rows = []
    for model in args.models:
        for seed in settings["seeds"]:
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
    results = kept_from_earlier(results, os.path.join(folder, "flat_regions.json"), args.models)
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
    kept, skip = [], False
    for argument in argv:
        if skip:
            skip = False
        elif argument == "--out":
            skip = True
        elif not argument.startswith("--out="):
            kept.append(argument)
    return " ".join(["python -m benchmarks.flat_regions", *kept])


def kept_from_earlier(results: dict, path: str, models: list[str]) -> dict:
    """`results`, with the runs of the models not run now kept from the file
    at `path` (if any), and which command, date and keras_als code made those
    (`"kept"`), so that each model can run in a process of its own."""
    if not os.path.exists(path):
        return results
    with open(path) as f:
        earlier = json.load(f)
    others = [r for r in earlier["runs"] if r["model"] not in models]
    if not others:
        return results
    kept = {r["model"] for r in others}
    older = earlier.get("kept", [])  # what the earlier file itself kept
    own = kept - {m for k in older for m in k["models"]}
    source = [k | {"models": sorted(set(k["models"]) & kept)} for k in older] + [
        {
            "models": sorted(own),
            "command": earlier["command"],
            "date": earlier["date"],
            "code": earlier.get("provenance", "unknown"),
        }
    ]
    source = [k for k in source if k["models"]]
    return results | {"runs": results["runs"] + others, "kept": source}
