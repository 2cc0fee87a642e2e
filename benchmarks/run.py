"""Runs the benchmark suite and writes RESULTS.md, results.json and the plots.

    python -m benchmarks.run           # full suite, about 25 min on 2 CPU cores
    python -m benchmarks.run --quick   # smaller budget, < 3 min (CI)

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
import platform
import sys
import time

import keras
import numpy as np
import tensorflow as tf

from benchmarks import (
    convergence,
    cost,
    fidelity,
    memory,
    plots,
    report,
    zoo,
)
from benchmarks.harness import isolation, scaling


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
    # als_fixed_global) would double that section: `python -m benchmarks.cost`.
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
                    f"error {report.layer_mean_error(m):.2e} (worst {m.worst_layer_error:.2e}) "
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
        for method in (report.BASELINE, report.OURS):
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


def _provenance() -> str:
    """The keras_als code measured: git commit, uncommitted files, hash of the sources."""
    import glob
    import hashlib
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "unknown"

    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "keras_als", "*.py"))):
        with open(path, "rb") as f:
            digest.update(f.read())
    dirty = ", ".join(
        line.strip() for line in git("status", "--porcelain", "--", "keras_als").splitlines()
    )
    return (
        f"commit {git('rev-parse', '--short', 'HEAD')}"
        + (f", uncommitted changes: {dirty}" if dirty else ", clean")
        + f"; sha256 of keras_als/*.py {digest.hexdigest()[:12]}"
    )


def _environment() -> str:
    return (
        f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.platform()}); Python {platform.python_version()}, TensorFlow "
        f"{tf.__version__}, Keras {keras.__version__}, NumPy {np.__version__}"
    )


SEPARATE = (
    "loss_span",
    "loss_span_float16_heads",
    "hard_outcomes",
    "detection",
    "heavy_tails",
    "real_models",
    "step_profile",
    "wrap_sweep",
)
"""Benchmarks run by their own commands; RESULTS.md takes in the tables they wrote."""


def separate_sections(folder: str) -> list[str]:
    """The markdown each separate benchmark wrote into `folder`, headings one level down."""
    sections = []
    for name in SEPARATE:
        path = os.path.join(folder, f"{name}.md")
        if os.path.exists(path):
            with open(path) as f:
                text = f.read().strip()
            sections.append(
                "\n".join(
                    "#" + line if line.startswith("#") else line for line in text.splitlines()
                )
            )
    return sections


def markdown(
    results: dict,
    targets: list[report.Target],
    command: str,
    images: list[str],
    separate: list[str] = (),
) -> str:
    """RESULTS.md from the results and targets, and the separate benchmarks' sections."""
    when = results.get("date") or datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    seconds = results["seconds"]
    methods = {m.name: m for m in scaling.ALL_METHODS + cost.BREAKDOWN}
    used = dict.fromkeys(m.method for m in results["measurements"])
    cases = "\n".join(f"- `{c.name}`: {c.description}" for c in results["cases"])
    lines = [
        "# keras_als benchmark results",
        "",
        "<!-- GENERATED by benchmarks/run.py: do not edit by hand; rerun the command. -->",
        "",
        "Generated by `benchmarks/run.py`; never edited by hand.",
        "",
        f"- Command: `{command}`",
        f"- Date: {when}",
        f"- Machine: {results.get('machine', 'not recorded')}",
        f"- keras_als measured: {results.get('provenance', 'not recorded')}",
        *(
            [
                f"- Tables re-rendered from this run's results.json on {results['rendered']} "
                f"by `{command} --render` (no new measurement)"
            ]
            if results.get("rendered")
            else []
        ),
        f"- Wall time: {seconds['total']:.0f} s ("
        + ", ".join(f"{part} {s:.0f} s" for part, s in seconds.items() if part != "total")
        + ")",
        "- CPU only: float16 is slow on CPUs; only ratios against Keras's "
        "`LossScaleOptimizer` in the same precision mean anything here, never a GPU speed-up.",
        "",
        "## Targets",
        "",
        "```",
        *[t.line() for t in targets],
        "```",
        "",
        "## Summary: keras_als (max_safe) against Keras LSO",
        "",
        "Gradient error (mean over layers, worst layer) and underflow rate against float32; "
        "full tables with every method below.",
        "",
        report.fidelity_summary(results["measurements"], results["hard"]),
        "",
        "## Methods",
        "",
        *[f"- `{name}`: {methods[name].label}" for name in used],
        "- `float32` is the reference of the fidelity tables and a column of the accuracy table.",
        "",
        "## 1. Gradient fidelity",
        "",
        "Relative error `||g_mixed - g_fp32|| / ||g_fp32||` of each unscaled weight gradient "
        "and underflow rate (share of elements non-zero in float32 and zero in the mixed "
        "run), on one batch, with the same weights as the float32 reference. *init*: initial "
        "weights after 20 steps at learning rate 0 (scales settle). *trained*: each method "
        f"first trains itself ({results['fidelity_steps']} Adam steps, "
        "3x as many for late training), then is given the float32-trained weights and "
        "settles 20 steps at learning rate 0, so all methods are compared at identical weights.",
        "",
        cases,
        "",
        report.fidelity_tables(results["measurements"], results["hard"]),
        "",
        "## 2. Convergence on real data",
        "",
        *[
            f"- `{t.name}`: {t.description}, Adam({t.learning_rate:g}), batch {t.batch}"
            for t in convergence.TASKS
        ],
        "- Seeds for "
        f"{', '.join(f'`{m}`' for m in convergence.TARGET_METHODS)}, the methods the "
        "accuracy target compares: "
        + "; ".join(
            f"{task.name} {sorted({r.seed for r in results['runs'] if r.task == task.name})}"
            for task in convergence.TASKS
        )
        + " (more on MNIST, whose per-seed differences spread more); seeds "
        f"{sorted({r.seed for r in results['runs'] if r.method not in convergence.TARGET_METHODS})}"
        " for the other methods. Held-out accuracy "
        "mean ± standard deviation over seeds (number of seeds); `model.fit(..., "
        "jit_compile=True)`. Every method trains from the same weights on the same "
        "batches per seed, so the difference from Keras LSO is paired by seed (mean ± "
        "standard error).",
        "",
        report.convergence_table(results["runs"]),
        "",
        "## 3. Step time (XLA, interleaved)",
        "",
        "keras_als's step time over Keras `LossScaleOptimizer`'s, same model, weights, batch "
        "and custom step, both `jit_compile=True`, in one process (a fresh one per model). "
        "Each method is built "
        "several times (instances: fresh model, optimizer and compiled step), since one "
        "compiled instance can run a few percent faster or slower than another of the same "
        "configuration for its whole life; every round times one block of every instance in "
        "a shuffled order, and the ratio is the median over rounds of the mean over "
        "instances. *LSO spread* is the slowest over the fastest Keras LSO instance: the "
        "noise floor."
        + (
            " `als_every_step` measures statistics on every step "
            "(`measure_every_n_steps=1`); `als_fixed_global` is keras_als's optimizer on the "
            "unwrapped model (one scale), the cost of the optimizer alone."
            if any(t.method != report.OURS for t in results["timings"])
            else ""
        ),
        "",
        report.cost_table(results["timings"]),
        "",
        "### Overhead against the number of wrapped layers (Dense(64, tanh) MLPs)",
        "",
        report.sweep_table(results["sweep"]),
        "",
        "## 4. Peak memory",
        "",
        "*Step* = XLA buffer assignment of the compiled training step (parameters, "
        "temporaries, outputs), what a device would hold; *live at peak* = the bytes of "
        'that step live at once at the busiest point of its schedule (XLA\'s "peak usage"; '
        "the step's total also counts the gaps XLA leaves packing its temporaries into one "
        "heap); *peak RSS* = the whole process "
        "(TensorFlow runtime, compiler, Python), one fresh subprocess per configuration. "
        "TensorFlow keeps no allocator statistics on the CPU.",
        "",
        report.memory_table(results["memory"]),
        "",
        "## 5. Plots",
        "",
        *[f"![{name}]({name})" for name in images],
        "",
    ]
    if separate:
        lines += [
            "## 6. Benchmarks with their own commands",
            "",
            "Each wrote its own table (command, date and commit in its section); this "
            "file takes them in as they are when it is rendered.",
            "",
        ]
        for section in separate:
            lines += [section, ""]
    return "\n".join(lines)


def _jsonable(results: dict) -> dict:
    out = {}
    for key, value in results.items():
        if key == "cases":
            out[key] = [c.name for c in value]
        elif isinstance(value, list):
            out[key] = [dataclasses.asdict(v) for v in value]
        elif isinstance(value, set):
            out[key] = sorted(value)
        else:
            out[key] = value
    return out


def load(path: str) -> dict:
    """Results saved by a run (`results.json`), as the dataclasses `run` returns."""
    with open(path) as f:
        saved = json.load(f)
    written = datetime.datetime.fromtimestamp(os.path.getmtime(path), datetime.UTC)
    saved.setdefault("date", written.strftime("%Y-%m-%d %H:%M UTC") + " (results.json written)")
    by_name = {c.name: c for c in zoo.cases()}
    return dict(
        saved,
        measurements=[
            fidelity.Measurement(**dict(m, layers=[tuple(row) for row in m["layers"]]))
            for m in saved["measurements"]
        ],
        runs=[convergence.Run(**r) for r in saved["runs"]],
        timings=[cost.Timing(**t) for t in saved["timings"]],
        sweep=[cost.Timing(**t) for t in saved["sweep"]],
        memory=[memory.Memory(**m) for m in saved["memory"]],
        hard=set(saved["hard"]),
        cases=[by_name[name] for name in saved["cases"]],
    )


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
    here = os.path.dirname(os.path.abspath(__file__))
    folder = args.out or os.path.join(here, "results", "quick" if args.quick else "")
    os.makedirs(folder, exist_ok=True)
    command = "python -m benchmarks.run" + (" --quick" if args.quick else "")

    if args.render:
        results = load(os.path.join(folder, "results.json"))
        command = results.get("command", command)
        results["rendered"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    else:
        provenance = _provenance()
        results = run(QUICK if args.quick else FULL, args.quick)
        results["provenance"] = provenance
        results["command"] = command
        results["machine"] = _environment()
        results["date"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    targets = report.targets(
        results["measurements"],
        results["hard"],
        results["runs"],
        results["timings"],
        results["sweep"],
        results["memory"],
    )
    images = plots.save_all(results["runs"], results["measurements"], folder)
    text = markdown(results, targets, command, images, separate_sections(folder))
    with open(os.path.join(folder, "RESULTS.md"), "w") as f:
        f.write(text)
    with open(os.path.join(folder, "results.json"), "w") as f:
        json.dump(_jsonable(results), f, indent=1, default=float)
    print()
    print(report.fidelity_summary(results["measurements"], results["hard"]))
    print()
    print(report.convergence_table(results["runs"]))
    print()
    print(report.cost_table(results["timings"]))
    print()
    print(report.sweep_table(results["sweep"]))
    print()
    print(report.memory_table(results["memory"]))
    print(f"\nWrote {os.path.join(folder, 'RESULTS.md')} in {results['seconds']['total']:.0f} s")
    for target in targets:
        print(target.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
