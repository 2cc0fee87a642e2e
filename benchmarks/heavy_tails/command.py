"""Heavy-tailed losses (issue 17): rare samples whose loss is far larger than the rest.

The study's command line (`python -m benchmarks.heavy_tails --help`; the plan
and target: the package docstring): runs the settings, judges each, and writes
heavy_tails.json and heavy_tails.md.
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
from benchmarks.heavy_tails.plan import (
    EXTRA_SETTINGS,
    KNOWN,
    QUICK_SEEDS,
    QUICK_SETTINGS,
    SEEDS,
    SETTINGS,
)
from benchmarks.heavy_tails.report import judge, markdown
from benchmarks.heavy_tails.training import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.heavy_tails", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, shorter training")
    parser.add_argument(
        "--settings",
        default=None,
        help="comma-separated setting names (default: all of SETTINGS; "
        f"also {', '.join(s.name for s in EXTRA_SETTINGS)}); not with --quick",
    )
    args = parser.parse_args(argv)
    settings = QUICK_SETTINGS if args.quick else SETTINGS
    if args.settings:
        if args.quick:
            parser.error("--settings and --quick do not go together")
        unknown = set(args.settings.split(",")) - set(KNOWN)
        if unknown:
            parser.error(f"unknown settings {sorted(unknown)}; known: {sorted(KNOWN)}")
        settings = tuple(KNOWN[n] for n in args.settings.split(","))
    seeds = QUICK_SEEDS if args.quick else SEEDS
    start, load = time.perf_counter(), os.getloadavg()[0]
    runs = run(settings, seeds)
    verdicts = [judge(runs, s.name) for s in settings]
    results = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick,
        "command": " ".join(["python -m benchmarks.heavy_tails", *(argv or sys.argv[1:])]),
        "seconds": time.perf_counter() - start,
        "load_average": (load, os.getloadavg()[0]),
        "environment": provenance.environment(),
        "provenance": provenance.code(),
        "settings": list(settings),
        "seeds": list(seeds),
        "runs": runs,
        "verdicts": verdicts,
    }
    text = markdown(results)
    print("\n" + text)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = os.path.join(here, "results")
    if args.quick:
        folder = os.path.join(folder, "quick")
    stem = "heavy_tails" + (f"-{args.settings.replace(',', '-')}" if args.settings else "")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, stem + ".md"), "w") as f:
        f.write(text)
    with open(os.path.join(folder, stem + ".json"), "w") as f:
        json.dump(
            {
                **results,
                "settings": [dataclasses.asdict(s) for s in settings],
                "runs": [dataclasses.asdict(r) for r in runs],
                "verdicts": [dataclasses.asdict(v) | {"line": v.line()} for v in verdicts],
            },
            f,
            indent=1,
            default=float,
        )
    for verdict in verdicts:
        print(verdict.line())
    return 0
