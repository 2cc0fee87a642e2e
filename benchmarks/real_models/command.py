"""Real architectures: keras.applications and KerasHub models, built offline.

The study's command line (`python -m benchmarks.real_models --help`; the plan
and targets: the package docstring). It measures the parts asked for, keeps
the other parts' rows in real_models.json, and writes real_models.md once
every model has every part. `--probe` is the entry of the fresh processes
that `probes` and the `--processes` options start.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import keras

from benchmarks.harness import xla_memory
from benchmarks.real_models.architectures import (
    BATCH,
    MODELS,
    OTHER_FAMILIES,
    TASKS,
    build,
    builder,
    data,
    train_on_batch,
)
from benchmarks.real_models.breakdown import (
    ABLATIONS,
    step_breakdown,
    step_breakdown_in_processes,
    traced_as,
)
from benchmarks.real_models.probes import (
    compile_breakdown,
    compile_times,
    memory_breakdown,
    memory_of,
)
from benchmarks.real_models.programs import graph_ops, step_kernels, unoptimized_by_origin
from benchmarks.real_models.report import markdown, memory_cell, missed_line, step_cell
from benchmarks.real_models.skips import skip_trace
from benchmarks.real_models.timing import (
    INSTANCES,
    build_order,
    step_times,
    step_times_in_processes,
)


def _probe(kind: str, name: str, method: str, jit: bool) -> None:
    """Subprocess entry: prints one JSON line.

    "compile": the first training step's seconds (with or without XLA).
    "memory": five XLA steps, then the XLA step's memory and the peak RSS.
    For both, `method` is a method or a variant of `probes.COMPILE_VARIANTS`.
    "step": `step_times`, with as many instances as `method` says.
    "breakdown": `step_breakdown`; `method` is "instances:variant,variant,...".
    """
    if kind == "step":
        print(json.dumps(step_times(name, instances=int(method))))
        return
    if kind == "breakdown":
        instances, variants = method.split(":")
        result = step_breakdown(name, instances=int(instances), variants=variants.split(","))
        print(json.dumps(result))
        return
    method, wrap, ablation = traced_as(method)  # a method, or a `probes.COMPILE_VARIANTS`
    if kind == "compile":
        model, _ = build(name, method, jit=jit, wrap=wrap)
        x, y = data(name, 1)
        start = time.perf_counter()
        with ablation:
            train_on_batch(model, x, y)
        print(json.dumps({"first_step": time.perf_counter() - start}))
        return
    with tempfile.TemporaryDirectory(prefix="keras_als_xla_") as dump:
        os.environ["XLA_FLAGS"] = xla_memory.dump_flags(dump, "one_step_on_data")
        model, _ = build(name, method, wrap=wrap)
        x, y = data(name, 1)
        before = xla_memory.high_water_mb()
        with ablation:
            for _ in range(5):
                train_on_batch(model, x, y)
        peak = xla_memory.high_water_mb()
        xla_bytes = xla_memory.xla_total(dump, "one_step_on_data")
        xla_peak_bytes = xla_memory.xla_peak(dump, "one_step_on_data")
    used = {"xla_bytes": xla_bytes, "xla_peak_bytes": xla_peak_bytes}
    print(json.dumps({**used, "peak_rss_mb": peak, "before_mb": before}))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.real_models", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--steps", type=int, default=1050, help="training steps for skips")
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"comma-separated; also any of {', '.join(OTHER_FAMILIES)}, and the "
        f"KerasHub tasks {', '.join(TASKS)} (all parts but skips)",
    )
    parser.add_argument(
        "--parts",
        default="skips,cost",
        help="skips (skipped steps), cost (step and compile time, memory), step (step "
        "time alone), compile (compile time and memory alone), memory (XLA step memory "
        "alone), memory_breakdown (XLA step memory of the compile breakdown's variants), "
        "compile_breakdown (first step without the crossing reductions), breakdown "
        "(step-time "
        "ablation), graph (operations in the traced step, kernels of the compiled one, and "
        "the instructions handed to XLA by origin), build_order (Keras's step "
        "time by the order its instances were built)",
    )
    parser.add_argument(
        "--methods",
        default="keras,keras_als",
        help="whose skipped steps to measure; a method left out keeps its last row (Keras's "
        "does not change with keras_als's code: same weights, batches and seed)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per compile")
    parser.add_argument(
        "--instances",
        type=int,
        default=INSTANCES,
        help="compiled instances per optimizer (step time)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="fresh processes the step time (and the breakdown) is measured in, each "
        "with --instances (--breakdown-instances) instances (1: this process)",
    )
    parser.add_argument(
        "--variants",
        default=",".join(ABLATIONS),
        help=f"the breakdown's variants, of {', '.join(ABLATIONS)} (keras is always in, "
        "and keras_als with keras_with_state)",
    )
    parser.add_argument(
        "--breakdown-instances",
        type=int,
        default=1,
        help="compiled instances per variant (breakdown)",
    )
    parser.add_argument("--out", default="benchmarks/results/real_models")
    parser.add_argument(
        "--probe", nargs=3, metavar=("KIND", "MODEL", "METHOD"), help=argparse.SUPPRESS
    )
    parser.add_argument("--no-xla", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        _probe(*args.probe, jit=not args.no_xla)
        return
    parts = args.parts.split(",")
    try:  # a run of one part keeps the other's results
        with open(args.out + ".json") as f:
            results = json.load(f)
    except FileNotFoundError:
        results = {"batch": BATCH, "models": {}}
    names = args.models.split(",")
    for name in names:
        builder(name)  # an unknown name fails before any run
    if "skips" in parts and set(names) & set(TASKS):
        raise ValueError(
            f"--parts skips does not take the KerasHub tasks ({', '.join(TASKS)}): their "
            "skipped steps are their sections' (python -m benchmarks.keras_hub_tasks)."
        )
    methods = args.methods.split(",")
    if not set(methods) <= {"keras", "keras_als"}:
        raise ValueError(f"--methods takes keras, keras_als or both; got {args.methods!r}.")
    kept = [m for m in ("keras", "keras_als") if m not in methods]
    for name in names if "skips" in parts and kept else []:
        row = results["models"].get(name, {})
        if row.get("steps") != args.steps or any(m not in row for m in kept):
            raise ValueError(
                f"{name}: no row of {', '.join(kept)} with {args.steps} steps to keep; "
                "measure both methods (--methods keras,keras_als)."
            )
    for name in names:
        row = results["models"].setdefault(name, {})
        if "skips" in parts:
            for method in methods:
                keras.utils.clear_session()
                trace, measured, _ = skip_trace(name, method, args.steps)
                first = trace[min(49, len(trace) - 1)]
                row[method] = {
                    "first_50": first,
                    "after_50": trace[-1] - first,
                    "skipped_at": [
                        i for i, n in enumerate(trace) if n > (trace[i - 1] if i else 0)
                    ],
                }
                if method == "keras_als":
                    row[method]["measured_steps"] = len(measured)
            row["steps"] = args.steps
            if "measured_steps" in row["keras_als"]:
                print(
                    f"{name:14s} keras_als measured on {row['keras_als']['measured_steps']} "
                    f"of {args.steps} steps",
                    flush=True,
                )
            print(
                f"{name:14s} skipped in first 50: keras {row['keras']['first_50']}, keras_als "
                f"{row['keras_als']['first_50']}; in the {args.steps - 50} after: keras "
                f"{row['keras']['after_50']}, keras_als {row['keras_als']['after_50']}",
                flush=True,
            )
        if "cost" in parts or "step" in parts:
            keras.utils.clear_session()
            for stale in ("step_processes", "step_process_ratios"):
                row.pop(stale, None)
            if args.processes > 1:
                row.update(step_times_in_processes(name, args.processes, args.instances))
            else:
                row.update(step_times(name, instances=args.instances))
            print(f"{name:14s} step time {step_cell(row)}", flush=True)
        if "cost" in parts or "compile" in parts:
            row.update(compile_times(name, args.repeats))
            print(f"{name:14s} compile time {row['compile_ratio']:.3f}x", flush=True)
        if "compile_breakdown" in parts:
            row["compile_breakdown"] = split = compile_breakdown(name, args.repeats)
            each = [
                f"{v} {split['seconds'][v]:.1f} ({ratio:.3f}x ± {error:.3f})"
                for v, (ratio, error) in split["ratio"].items()
            ]
            print(
                f"{name:14s} first step with XLA, s (median of {args.repeats} processes; "
                "ratio to keras's, paired by round, ± s.e.): " + ", ".join(each),
                flush=True,
            )
        if "cost" in parts or "compile" in parts or "memory" in parts:
            used = {method: memory_of(name, method) for method in ("keras", "keras_als")}
            row["memory"] = used
            row["memory_ratio"] = used["keras_als"]["xla_bytes"] / used["keras"]["xla_bytes"]
            row["memory_peak_ratio"] = (
                used["keras_als"]["xla_peak_bytes"] / used["keras"]["xla_peak_bytes"]
            )
            print(f"{name:14s} XLA step memory {memory_cell(row)}", flush=True)
        if "memory_breakdown" in parts:
            row["memory_breakdown"] = split = memory_breakdown(name)
            print(
                f"{name:14s} XLA step memory over Keras's, total (at peak): "
                + ", ".join(f"{v} {t:.3f}x ({p:.3f}x)" for v, (t, p) in split["ratio"].items()),
                flush=True,
            )
        if "breakdown" in parts:
            keras.utils.clear_session()
            asked = {"keras", *args.variants.split(",")}
            if "keras_with_state" in asked:
                asked.add("keras_als")  # whose variables it counts
            variants = [v for v in ABLATIONS if v in asked]
            if args.processes > 1:
                broken_down = step_breakdown_in_processes(
                    name, args.processes, args.breakdown_instances, variants
                )
            else:
                broken_down = step_breakdown(
                    name, instances=args.breakdown_instances, variants=variants
                )
            row["breakdown_ms"] = broken_down["ms"]
            row["breakdown_instances"] = broken_down["instances"]
            for stale in ("breakdown_se", "breakdown_processes", "breakdown_process_ratios"):
                row.pop(stale, None)
            if "ratio_se" in broken_down:
                row["breakdown_se"] = broken_down["ratio_se"]
            if "processes" in broken_down:
                row["breakdown_processes"] = broken_down["processes"]
                row["breakdown_process_ratios"] = broken_down["process_ratios"]
            print(
                f"{name:14s} step ms: "
                + ", ".join(f"{k} {v:.2f}" for k, v in row["breakdown_ms"].items()),
                flush=True,
            )
        if "build_order" in parts:
            keras.utils.clear_session()
            row["build_order"] = build_order(name)
            print(
                f"{name:14s} Keras instances' step time over the first built's, in build "
                "order: " + ", ".join(f"{r:.3f}" for r in row["build_order"]),
                flush=True,
            )
        if "graph" in parts:
            row["graph_ops"] = graph_ops(name)
            row["step_kernels"] = step_kernels(name)
            ops, kernels = row["graph_ops"], row["step_kernels"]
            print(
                f"{name:14s} operations in the traced step: keras {ops['keras']}, keras_als "
                f"{ops['keras_als']} ({ops['keras_als'] / ops['keras']:.2f}x); kernels of "
                f"the compiled step: keras {kernels['keras']}, keras_als {kernels['keras_als']}; "
                "of those, only to hand conditionals their operands: keras "
                f"{kernels['for_branches_only']['keras']}, keras_als "
                f"{kernels['for_branches_only']['keras_als']}",
                flush=True,
            )
            row["unoptimized"] = unoptimized = unoptimized_by_origin(name)
            count = unoptimized["instructions"]
            print(
                f"{name:14s} HLO instructions handed to XLA: keras {count['keras']}, keras_als "
                f"{count['keras_als']} ({count['keras_als'] / count['keras']:.2f}x); the most "
                "different by origin: "
                + ", ".join(f"{o} {d:+d}" for o, d in unoptimized["extra_by_origin"]),
                flush=True,
            )
        print(f"{name:14s} targets missed: {missed_line(row)}", flush=True)
        with open(args.out + ".json", "w") as f:
            json.dump(results, f, indent=1)
    rows = results["models"]
    if all("steps" in rows.get(n, {}) and "without_xla_seconds" in rows[n] for n in MODELS):
        text = markdown(results)
        with open(args.out + ".md", "w") as f:
            f.write(text)
