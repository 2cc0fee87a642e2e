"""`python -m benchmarks.hard_outcomes [--quick] [--render]`: trains, prints and
writes benchmarks/results/hard_outcomes.json and .md (the plan: the package's
docstring)."""

from __future__ import annotations

import argparse
import json

from benchmarks.hard_outcomes.plan import SEEDS, STEPS
from benchmarks.hard_outcomes.report import markdown
from benchmarks.hard_outcomes.training import run_case
from benchmarks.harness import isolation, zoo


def main(argv=None) -> None:
    """Trains every method on every hard case (or, with --render, only re-renders)."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.hard_outcomes",
        description="Training outcomes on the fidelity benchmark's hard models.",
    )
    parser.add_argument("--quick", action="store_true", help="2 seeds, 100 steps (a check)")
    parser.add_argument("--out", default="benchmarks/results/hard_outcomes")
    parser.add_argument("--render", action="store_true", help="rewrite the .md from the .json")
    args = parser.parse_args(argv)
    if args.render:
        with open(args.out + ".json") as f:
            table = markdown(json.load(f))
        with open(args.out + ".md", "w") as f:
            f.write(table)
        print(table)
        return
    seeds, steps = (SEEDS[:2], 100) if args.quick else (SEEDS, STEPS)
    hard = [c.name for c in zoo.cases() if c.hard]
    results = {"steps": steps, "seeds": list(seeds), "cases": {}}
    with isolation.worker_pool() as pool:
        for name in hard:
            runs = []
            for seed in seeds:  # one task at a time (see isolation.worker_pool)
                runs.append(pool.submit(run_case, name, seed, steps).result())
                print(
                    f"{name} seed {seed}: "
                    + ", ".join(
                        f"{m} {r['final_loss']:.4g} ({r['skipped']} skipped)"
                        for m, r in runs[-1].items()
                    ),
                    flush=True,
                )
            results["cases"][name] = runs
    table = markdown(results)
    print(table)
    if not args.quick:
        with open(args.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
        with open(args.out + ".md", "w") as f:
            f.write(table)
