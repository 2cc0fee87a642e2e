"""Two losses far apart: where one global loss scale starts to lose, and keras_als does not.

The study's command line (`python -m benchmarks.loss_span --help`; the plan:
the package docstring): the exponent sweep, or with `--float16-heads` the
per-loss-scales study; each run in a fresh process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

from benchmarks.harness import isolation
from benchmarks.loss_span.report import markdown, per_output_markdown, plot
from benchmarks.loss_span.training import (
    EXPONENTS,
    METHODS,
    PER_OUTPUT_EXPONENT,
    PER_OUTPUT_METHODS,
    SEEDS,
    train,
)


def _commit() -> str:
    import subprocess

    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "keras_als"], capture_output=True, text=True
        ).stdout.strip()
        return head + (" (keras_als modified)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main_per_output(seeds) -> int:
    """The per-loss-scales study (`--float16-heads`)."""
    runs = []
    for seed in seeds:
        for method in PER_OUTPUT_METHODS:
            run = isolation.in_fresh_process(train, PER_OUTPUT_EXPONENT, method, seed, None, True)
            runs.append(run)
            print(
                f"float16 heads seed {seed} {method:21s} accuracy {100 * run.accuracy:5.1f}%"
                f" flushed {100 * run.flushed:5.1f}% skipped {run.skipped}",
                flush=True,
            )
    folder = os.path.join("benchmarks", "results")
    with open(os.path.join(folder, "loss_span_float16_heads.json"), "w") as f:
        json.dump({"commit": _commit(), "runs": [dataclasses.asdict(r) for r in runs]}, f, indent=1)
    text = per_output_markdown(runs)
    with open(os.path.join(folder, "loss_span_float16_heads.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.loss_span", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 exponents")
    parser.add_argument(
        "--float16-heads", action="store_true", help="the per-loss-scales study instead"
    )
    args = parser.parse_args(argv)
    if args.float16_heads:
        return main_per_output(SEEDS[:1] if args.quick else SEEDS)
    exponents, seeds = ((0, 9, 12), SEEDS[:1]) if args.quick else (EXPONENTS, SEEDS)
    folder = os.path.join("benchmarks", "results", *(["quick"] if args.quick else []))
    os.makedirs(folder, exist_ok=True)
    start = time.perf_counter()
    runs = []
    for exponent in exponents:
        for seed in seeds:
            for method in METHODS:
                run = isolation.in_fresh_process(train, exponent, method, seed)
                runs.append(run)
                print(
                    f"10^{exponent} seed {seed} {method:17s} accuracy {100 * run.accuracy:5.1f}%"
                    f" flushed {100 * run.flushed:5.1f}% skipped {run.skipped}"
                    f" ({run.seconds:.0f} s)",
                    flush=True,
                )
    results = {
        "command": "python -m benchmarks.loss_span" + (" --quick" if args.quick else ""),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
        "seconds": time.perf_counter() - start,
        "runs": [dataclasses.asdict(r) for r in runs],
    }
    with open(os.path.join(folder, "loss_span.json"), "w") as f:
        json.dump(results, f, indent=1)
    plot(results, os.path.join(folder, "loss_span.png"))
    text = markdown(results, "loss_span.png")
    with open(os.path.join(folder, "loss_span.md"), "w") as f:
        f.write(text)
    print(text)
    return 0
