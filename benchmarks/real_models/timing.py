"""Step time: compiled instances of both methods, their steps interleaved."""

from __future__ import annotations

import math
import random
import statistics
import time

import keras

from benchmarks.harness import isolation, stats
from benchmarks.harness.stats import ratio_and_standard_error
from benchmarks.real_models import probes
from benchmarks.real_models.architectures import build, data, train_on_batch

INSTANCES = 3
"""Compiled instances per optimizer that the step time is measured on, by default."""


def step_times(name: str, rounds: int = 100, seed: int = 0, instances: int = INSTANCES) -> dict:
    """Step time of keras_als over Keras's, from `instances` compiled instances of each.

    On this CPU one compiled instance can run a few percent faster or slower
    than another of the same configuration for as long as it lives (see
    `benchmarks.suite.cost`), so one instance per method would compare those draws.
    Every instance is built the same way (same weights, same batch); after
    warm-up each round runs one step of every instance in a shuffled order,
    in one process. The ratio and its standard error come from the instances'
    median step times (`ratio_and_standard_error`); `keras_spread`, the
    slowest Keras instance over the fastest, shows how far two instances of
    one configuration differ.
    """
    x, y = data(name, 1, seed)
    built = {}
    discard_first_build(name, x, y, seed)
    for k in range(instances):
        for method in isolation.in_build_order(("keras", "keras_als"), k):
            built[method, k] = warmed_up(name, x, y, seed, method=method)
    median = interleaved_medians(built, x, y, rounds)
    each = {m: [median[m, k] for k in range(instances)] for m in ("keras", "keras_als")}
    ratio, standard_error = ratio_and_standard_error(each["keras_als"], each["keras"])
    return {
        "step_ratio": ratio,
        "step_ratio_se": standard_error,
        "keras_spread": max(each["keras"]) / min(each["keras"]),
        "step_instances": instances,
        "step_seconds": each,
    }


def warmed_up(name: str, x, y, seed: int = 0, **arguments) -> keras.Model:
    """Model `name` from `build(name, seed=seed, **arguments)`, traced, compiled
    and warmed up by three training steps on `x`, `y`."""
    model, _ = build(name, seed=seed, **arguments)
    for _ in range(3):
        train_on_batch(model, x, y)
    return model


def discard_first_build(name: str, x, y, seed: int = 0) -> None:
    """Builds, compiles and steps one model of Keras's that is not timed.

    In a process, the first compiled model built ran about 5% faster than
    every later one of the same configuration (GPT-2, six and eight Keras
    instances in one process: the first 1.000, the others 1.02-1.08 of it,
    `python -m benchmarks.real_models --parts build_order`). Timed first, it
    favored the method built first: Keras's, in every step-time run before
    this was found; `isolation.in_build_order` alternates the rest.
    """
    warmed_up(name, x, y, seed, method="keras")


def build_order(name: str, instances: int = 6, rounds: int = 200, seed: int = 0) -> list[float]:
    """Median step times of `instances` Keras models of one configuration, in the
    order they were built, steps interleaved in a shuffled order, over the
    first's: how far the order of building moves a step time."""
    x, y = data(name, 1, seed)
    built = {k: warmed_up(name, x, y, seed, method="keras") for k in range(instances)}
    median = interleaved_medians(built, x, y, rounds, seed)
    return [median[k] / median[0] for k in range(instances)]


def step_times_in_processes(name: str, processes: int, instances: int = INSTANCES) -> dict:
    """Step time of keras_als over Keras's from `processes` fresh processes, each
    running `step_times` with `instances` instances of each optimizer.

    The instances of one process share its draw of conditions (memory layout,
    the machine's state while it runs): two runs of `step_times` on GPT-2, ten
    instances each, the same code, gave 1.040x +- 0.012 and 1.002x +- 0.010, so
    the standard error within one process understates the spread from run to
    run. Here each process gives one ratio, and the result is their geometric
    mean with the standard error of their spread (`ratio_over_processes`).
    """
    runs = [probes.run_probe("step", name, str(instances), True) for _ in range(processes)]
    ratios = [run["step_ratio"] for run in runs]
    ratio, standard_error = ratio_over_processes(ratios)
    return {
        "step_ratio": ratio,
        "step_ratio_se": standard_error,
        "keras_spread": max(run["keras_spread"] for run in runs),
        "step_instances": instances,
        "step_processes": processes,
        "step_process_ratios": ratios,
        "step_seconds": [run["step_seconds"] for run in runs],
    }


def ratio_over_processes(ratios: list[float]) -> tuple[float, float]:
    """Geometric mean of `ratios` (one per process) and its standard error,
    `mean * stdev(log ratios) / sqrt(n)` (first order; NaN with one ratio)."""
    mean_log, error = stats.mean_and_standard_error([math.log(r) for r in ratios])
    return math.exp(mean_log), math.exp(mean_log) * error


def interleaved_medians(models: dict, x, y, rounds: int, seed: int = 0) -> dict:
    """Median seconds per training step of each (compiled) model; each round runs
    one step of every model, in a shuffled order (no model always runs first)."""
    order = random.Random(seed)
    keys = list(models)
    times = {key: [] for key in keys}
    for _ in range(rounds):
        for key in order.sample(keys, len(keys)):
            start = time.perf_counter()
            train_on_batch(models[key], x, y)
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(t) for key, t in times.items()}
