"""Runs the benchmark suite and writes RESULTS.md, results.json and the plots.

    python -m benchmarks.suite           # full suite, about 25 min on 2 CPU cores
    python -m benchmarks.suite --quick   # smaller budget, < 3 min (CI)

The full run writes into benchmarks/results/, the quick one into
benchmarks/results/quick/. The run prints every table and ends with one
PASS/FAIL line per target of the issue. It exits non-zero only if it crashes;
a missed target is reported, not raised.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import sys
import time

from benchmarks.harness import isolation, provenance, scaling, zoo
from benchmarks.suite import (
    convergence,
    cost,
    fidelity,
    memory,
    plots,
    results_md,
    tables,
    targets,
)


@dataclasses.dataclass(frozen=True)
class Budget:
    """How much the suite measures."""

    cases: tuple[str, ...] | None  # fidelity cases, None for all
    methods: tuple[scaling.Method, ...]
    fidelity_steps: int
    seeds: tuple[int, ...]
    more_seeds: dict[str, tuple[int, ...]]  # per task, more seeds for TARGET_METHODS
    epochs: dict
    blocks: int
    steps_per_block: int
    instances: int  # compiled instances of each method in the step-time rounds
    breakdown: bool
    timing_models: tuple[str, ...] | None  # None for all
    sweep: tuple[tuple[int, int], ...]  # (wrapped layers, instances of each method)
    memory_models: tuple[str, ...]


FULL = Budget(
    cases=None,
    methods=scaling.ALL_METHODS,
    fidelity_steps=200,
    seeds=(0, 1, 2),
    more_seeds=convergence.MORE_SEEDS,
    epochs={"digits_cnn": 30, "mnist_mlp": 10},
    blocks=16,
    steps_per_block=20,
    # Five: two Keras LSO instances of the residual CNN differed by up to 18%;
    # these models compile in seconds. The breakdown variants (als_every_step,
    # als_fixed_global) would double that section: `python -m benchmarks.suite.cost`.
    instances=5,
    breakdown=False,
    timing_models=None,
    # XLA compiles a 200-layer step for 1-2 minutes (Keras LSO's the longest), on one
    # core: two instances of each method there took 438 s, over the budget. Its
    # 30 ms step makes instances differ least (Keras LSO's by 1.04x in two runs).
    sweep=((10, 3), (50, 3), (200, 1)),
    memory_models=memory.MODELS,
)
QUICK = Budget(
    cases=("deep_mlp", "deep_sigmoid"),
    methods=(scaling.FLOAT32, scaling.KERAS_LSO, scaling.ALS_MAX_SAFE),
    fidelity_steps=20,
    seeds=(0,),
    more_seeds={},
    epochs={"digits_cnn": 6, "mnist_mlp": 2},
    blocks=8,
    steps_per_block=10,
    instances=2,
    breakdown=False,
    timing_models=("transformer",),
    sweep=((4, 2), (16, 2)),
    memory_models=("cnn_batchnorm",),
)


def _log(message: str) -> None:
    print(message, flush=True)


def run(budget: Budget, quick: bool) -> dict:
    """Measures everything in `budget`; returns the results as dataclass lists."""
    timings: dict[str, float] = {}
    start = time.perf_counter()
    all_cases = zoo.cases()
    cases = [c for c in all_cases if budget.cases is None or c.name in budget.cases]
    methods = list(budget.methods)
    # Fidelity cases and training runs in a worker process (renewed every 20
    # tasks), so that nothing they compiled stays in this one.
    with isolation.worker_pool() as pool:
        _log("== Gradient fidelity (per layer, vs float32, same weights and batch)")
        measurements = []
        for case in cases:
            t = time.perf_counter()
            found = pool.submit(
                fidelity.measure_named_case, case.name, methods, budget.fidelity_steps
            ).result()
            for m in found:
                _log(
                    f"  {m.case:16s} {m.method:20s} {m.phase:8s} "
                    f"error {targets.layer_mean_error(m):.2e} (worst {m.worst_layer_error:.2e}) "
                    f"underflow {m.underflow:.4f} skipped {m.skipped}"
                )
            _log(f"  ({case.name}: {time.perf_counter() - t:.0f}s)")
            measurements += found
        timings["fidelity"] = time.perf_counter() - start
        t = time.perf_counter()
        _log("== Convergence on real data")
        runs = convergence.run_all(
            methods, list(budget.seeds), budget.epochs, pool, log=_log, more_seeds=budget.more_seeds
        )
        timings["convergence"] = time.perf_counter() - t

    t = time.perf_counter()
    _log("== Step time, interleaved, jit_compile=True")
    steps = cost.run_all(
        budget.blocks,
        budget.steps_per_block,
        budget.breakdown,
        budget.timing_models,
        log=_log,
        instances=budget.instances,
    )
    _log("== Overhead against wrapped layers")
    sweep = cost.layer_sweep(budget.sweep, budget.blocks, budget.steps_per_block, log=_log)
    timings["step time"] = time.perf_counter() - t

    t = time.perf_counter()
    _log("== Peak memory (one subprocess per configuration)")
    mem = []
    for model in budget.memory_models:
        for method in (targets.BASELINE, targets.OURS):
            mem.append(memory.measure(model, method))
            _log(f"  {mem[-1]}")
    timings["memory"] = time.perf_counter() - t
    timings["total"] = time.perf_counter() - start
    hard = {c.name for c in all_cases if c.hard}
    return {
        "measurements": measurements,
        "runs": runs,
        "timings": steps,
        "sweep": sweep,
        "memory": mem,
        "hard": hard,
        "cases": cases,
        "seconds": timings,
        "quick": quick,
        "fidelity_steps": budget.fidelity_steps,
    }


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small budget (< 3 min), for CI")
    parser.add_argument("--out", help="output folder (default benchmarks/results[/quick])")
    parser.add_argument(
        "--render",
        action="store_true",
        help="measure nothing: rebuild RESULTS.md, the plots and the targets from the "
        "results.json of an earlier run in the output folder",
    )
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = args.out or os.path.join(here, "results", "quick" if args.quick else "")
    os.makedirs(folder, exist_ok=True)
    command = "python -m benchmarks.suite" + (" --quick" if args.quick else "")

    if args.render:
        results = results_md.load(os.path.join(folder, "results.json"))
        command = results.get("command", command)
        results["rendered"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    else:
        code = provenance.code()
        results = run(QUICK if args.quick else FULL, args.quick)
        results["provenance"] = code
        results["command"] = command
        results["machine"] = provenance.environment()
        results["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    judged = targets.judge(results)
    images = plots.save_all(results["runs"], results["measurements"], folder)
    separate = results_md.separate_sections(folder)
    text = results_md.markdown(results, judged, command, images, separate)
    with open(os.path.join(folder, "RESULTS.md"), "w") as f:
        f.write(text)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(results_md.jsonable(results), f, indent=1, default=float)
    print()
    print(tables.fidelity_summary(results["measurements"], results["hard"]))
    print()
    print(tables.convergence_table(results["runs"]))
    print()
    print(tables.cost_table(results["timings"]))
    print()
    print(tables.sweep_table(results["sweep"]))
    print()
    print(tables.memory_table(results["memory"]))
    print(f"\nWrote {os.path.join(folder, 'RESULTS.md')} in {results['seconds']['total']:.0f} s")
    for target in judged:
        print(target.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
