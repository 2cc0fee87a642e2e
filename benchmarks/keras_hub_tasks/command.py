"""The studies' command line: `python -m benchmarks.keras_hub_tasks {retinanet,lora} [--quick]`.

Runs every seed of a study's plan in this process, then writes `<study>.json`
(every run) and `<study>.md` (the section RESULTS.md takes in). A study's
`run_seed` returns its runs and a dict of other results of the seed, which the
JSON keeps as one list per key, in the order of the seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

from benchmarks.harness import provenance
from benchmarks.keras_hub_tasks import lora, report, retinanet

STUDIES = {"retinanet": retinanet, "lora": lora}


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.keras_hub_tasks", description=__doc__.splitlines()[0]
    )
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--quick", action="store_true", help="1 seed, 2 short blocks")
    parser.add_argument("--out", help="output folder (default benchmarks/results[/quick])")
    args = parser.parse_args(argv)
    module = STUDIES[args.study]
    plan = module.QUICK if args.quick else {"seeds": module.SEEDS}
    arguments = {k: v for k, v in plan.items() if k != "seeds"}
    start, load = time.perf_counter(), os.getloadavg()[0]
    runs, extras = [], {}
    for seed in plan["seeds"]:
        done, of_seed = module.run_seed(seed, **arguments)
        for key, value in of_seed.items():
            extras.setdefault(key, []).append(value)
        runs += done
        print(f"seed {seed}: " + ", ".join(f"{r.method} {r.outcome:.4g}" for r in done), flush=True)
    settings = {
        k: getattr(module, k)
        for k in ("BATCH", "STEPS_PER_BLOCK", "BLOCKS", "LEARNING_RATE", "RANK", "PRETRAIN_STEPS")
        if hasattr(module, k)
    } | {k.upper(): v for k, v in arguments.items()}
    results = {
        "study": args.study,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m benchmarks.keras_hub_tasks", *(argv or sys.argv[1:])]),
        "seconds": time.perf_counter() - start,
        "load_average": (load, os.getloadavg()[0]),
        "environment": provenance.environment(),
        "provenance": provenance.code(),
        "settings": settings,
        **extras,
        "runs": [dataclasses.asdict(r) for r in runs],
    }
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = args.out or os.path.join(here, "results", "quick" if args.quick else "")
    os.makedirs(folder, exist_ok=True)
    text = report.markdown(results)
    with open(os.path.join(folder, f"{args.study}.json"), "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(folder, f"{args.study}.md"), "w") as f:
        f.write(text)
    print(text)
    return 0
