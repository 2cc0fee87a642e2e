"""Compile time and XLA step memory, each measured in a fresh process."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys

from benchmarks.harness import stats


def compile_times(name: str, repeats: int = 3) -> dict:
    """First-step time of both methods, each in a fresh process, alternating.

    A fresh process is what a user's first step costs, and it keeps one
    method's compile from warming caches for the other. The first step with
    XLA (trace, graph and XLA compile, one run) and without it (trace, graph,
    one run) tell the tracing from the XLA compile. The ratio is of the
    medians over `repeats` processes per method.
    """
    seconds = {(m, j): [] for m in ("keras", "keras_als") for j in (True, False)}
    for _ in range(repeats):
        for jit in (True, False):
            for method in ("keras", "keras_als"):
                seconds[method, jit].append(run_probe("compile", name, method, jit)["first_step"])
    median = {key: statistics.median(value) for key, value in seconds.items()}
    return {
        "compile_ratio": median["keras_als", True] / median["keras", True],
        "compile_seconds": {m: median[m, True] for m in ("keras", "keras_als")},
        "without_xla_seconds": {m: median[m, False] for m in ("keras", "keras_als")},
        "compile_samples": {f"{m} {'xla' if j else 'no xla'}": v for (m, j), v in seconds.items()},
    }


COMPILE_VARIANTS = (
    "keras",
    "keras_als",
    "keras_als:no_crossing_reductions",
    "optimizer_only",
    "wrapper_only",
)
"""The compile breakdown's variants: a method, after a colon an ablation
(`benchmarks.harness.ablations.NAMED`) its step is traced without;
`optimizer_only`, keras_als's optimizer on the model not instrumented;
`wrapper_only`, the instrumented model with Keras's optimizer."""

FUSED_VARIANTS = ("keras_als:no_crossing_reductions", "optimizer_only")
"""The compile variants whose fusions `--parts graph` counts besides Keras's
and keras_als's (`wrapper_only` compiles Keras's program: `same_program`)."""


def compile_breakdown(name: str, repeats: int = 3, variants=COMPILE_VARIANTS) -> dict:
    """First step with XLA of each of `variants`, each in a fresh process.

    Each round runs every variant once, in an order shuffled anew (seeded by
    the round): in a fixed order each variant holds the same place in every
    round, so whatever drifts within a round biases it alike each time, and
    pairing by round does not cancel that. "seconds": each
    variant's median over `repeats` processes; "ratio": each variant's
    `[ratio, standard error]` to the first variant's, paired by round
    (`stats.paired_ratio_and_standard_error`); "orders": each round's order.
    """
    seconds = {v: [] for v in variants}
    orders = []
    for round_index in range(repeats):
        order = random.Random(round_index).sample(list(variants), len(variants))
        orders.append(order)
        for variant in order:
            seconds[variant].append(run_probe("compile", name, variant, True)["first_step"])
    reference = seconds[variants[0]]
    return {
        "seconds": {v: statistics.median(s) for v, s in seconds.items()},
        "ratio": {
            v: list(stats.paired_ratio_and_standard_error(s, reference)) for v, s in seconds.items()
        },
        "samples": seconds,
        "orders": orders,
    }


def memory_of(name: str, method: str) -> dict:
    """XLA step memory and peak RSS of one configuration (a method or a variant
    of `COMPILE_VARIANTS`), in a fresh process."""
    return run_probe("memory", name, method, True)


def memory_breakdown(name: str, variants=COMPILE_VARIANTS) -> dict:
    """XLA step memory of each of `variants` (the compile breakdown's), each in
    a fresh process: "bytes", each variant's `[total, at peak]`; "ratio", each
    over the first variant's. XLA's buffer assignment is fixed by the program,
    so one process per variant is enough."""
    used = {v: memory_of(name, v) for v in variants}
    bytes_ = {v: [u["xla_bytes"], u["xla_peak_bytes"]] for v, u in used.items()}
    total, peak = bytes_[variants[0]]
    return {"bytes": bytes_, "ratio": {v: [t / total, p / peak] for v, (t, p) in bytes_.items()}}


def run_probe(kind: str, name: str, method: str, jit: bool) -> dict:
    """Runs `_probe` in a fresh process and returns its JSON line."""
    command = [sys.executable, "-m", "benchmarks.real_models", "--probe", kind, name, method]
    command += [] if jit else ["--no-xla"]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{kind} probe {name} {method} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])
