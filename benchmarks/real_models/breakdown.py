"""Where the step time goes: ablations of keras_als's step, timed against Keras's."""

from __future__ import annotations

import contextlib
import math
import statistics

import keras_als
from benchmarks.harness import ablations, isolation
from benchmarks.harness.stats import ratio_and_standard_error
from benchmarks.real_models import probes
from benchmarks.real_models.architectures import build, data, train_on_batch
from benchmarks.real_models.timing import (
    discard_first_build,
    interleaved_medians,
    ratio_over_processes,
)

ABLATIONS = (
    "keras",
    "keras_again",
    "keras_als",
    "keras_with_state",
    "measuring_never",
    "no_boundary_reductions",
    "no_boundary_rescaling",
    "optimizer_only",
    "wrapper_only",
)
"""The step-time ablation's variants (`step_breakdown`)."""


def method_and_wrap(variant: str) -> tuple[str, bool | None]:
    """Whose optimizer a variant of `ABLATIONS` (or of the compile breakdown's)
    trains with, and whether its model is instrumented (None: as the method is)."""
    keras_optimizer = variant in ("keras", "keras_again", "wrapper_only", "keras_with_state")
    wrap = {"optimizer_only": False, "wrapper_only": True}.get(variant)
    return ("keras" if keras_optimizer else "keras_als"), wrap


def traced_as(variant: str) -> tuple[str, bool | None, contextlib.AbstractContextManager]:
    """A compile variant's (`probes.COMPILE_VARIANTS`) method and instrumentation
    (`method_and_wrap` of the part before a colon), and the ablation its step
    is traced inside (`ablations.named` of the part after)."""
    name, _, ablation = variant.partition(":")
    return (*method_and_wrap(name), ablations.named(ablation))


def _never_measure_again(optimizer) -> None:
    """Sets `optimizer`'s next measurement a million steps away."""
    masks = optimizer.scaling.counter_masks()
    values = {"steps_until_measuring": 10**6}
    counters = optimizer.scaling.counters_with(masks, values=values)
    optimizer.scaling.assign(new_counters=counters)


def step_breakdown(
    name: str, rounds: int = 300, seed: int = 0, instances: int = 1, variants=ABLATIONS
) -> dict:
    """What keras_als's step time is spent on: median step times in one process,
    steps interleaved, of Keras's optimizer, a second group of it built the
    same way (what two groups of one configuration differ by: the resolution
    of these ratios), keras_als, keras_als whose scales are
    never measured again after the warm-up steps (the next measurement set 10**6 steps away),
    keras_als without the reductions of the gradients crossing the boundaries (an
    ablation that changes what the scales are chosen from, for costing only),
    keras_als without the boundaries' divisions (every scale `ablations.ONE_SCALE`, so
    every divisor is 1 and leaving them out changes no value), and
    each half alone: keras_als's optimizer on the model not wrapped (one scale,
    the loss's), and the wrapped model with Keras's optimizer; and Keras's
    optimizer assigning, every step, as many small variables of its own as
    keras_als's optimizer adds to Keras's (each variable a compiled step updates
    costs it a fixed time on a CPU).

    Each of `variants` (of `ABLATIONS`, in that order; `keras_with_state`
    needs `keras_als` before it) is built `instances` times (see
    `step_times`). Returns `ms`,
    each variant's geometric mean over its instances of their median step
    times, and, with two or more instances, `ratio_se`: the standard error of
    each variant's ratio to Keras's (`ratio_and_standard_error`).
    """
    x, y = data(name, 1, seed)
    built, optimizers = {}, {}
    discard_first_build(name, x, y, seed)
    for k in range(instances):
        for variant in isolation.in_build_order(tuple(variants), k):
            method, wrap = method_and_wrap(variant)
            state = 0
            if variant == "keras_with_state":  # keras and keras_als are built (group 0 first)
                state = len(optimizers["keras_als"].variables) - len(optimizers["keras"].variables)
            unrescaled = variant == "no_boundary_rescaling"
            policy = keras_als.policies.Fixed(ablations.ONE_SCALE) if unrescaled else "max_safe"
            model, optimizer = build(
                name,
                method,
                seed,
                wrap=wrap,
                state_variables=state,
                scale_policy=policy,
            )
            optimizers[variant] = optimizer
            with contextlib.ExitStack() as ablated:
                if variant == "no_boundary_reductions":
                    ablated.enter_context(ablations.without_crossing_reductions())
                if unrescaled:
                    ablated.enter_context(ablations.without_boundary_rescaling())
                for _ in range(3):  # trace, compile and warm up
                    train_on_batch(model, x, y)
            if variant == "measuring_never":
                _never_measure_again(optimizer)
            built[variant, k] = model
    median = interleaved_medians(built, x, y, rounds, seed)
    each = {v: [median[v, k] for k in range(instances)] for v in variants}
    result = {
        "ms": {v: 1e3 * math.exp(statistics.fmean(map(math.log, t))) for v, t in each.items()},
        "instances": instances,
    }
    if instances > 1:
        result["ratio_se"] = {
            v: ratio_and_standard_error(t, each["keras"])[1] for v, t in each.items()
        }
    return result


def step_breakdown_in_processes(
    name: str, processes: int, instances: int = 1, variants=ABLATIONS
) -> dict:
    """`step_breakdown` in `processes` fresh processes: each variant's ratio to
    Keras's is the geometric mean of the processes' ratios, with the standard
    error of their spread (`ratio_over_processes`), as `step_times_in_processes`
    does, since one process's instances share its draw of conditions."""
    argument = f"{instances}:{','.join(variants)}"
    runs = [probes.run_probe("breakdown", name, argument, True)["ms"] for _ in range(processes)]
    ratios = {v: [run[v] / run["keras"] for run in runs] for v in variants}
    return {
        "ms": {v: math.exp(statistics.fmean(math.log(run[v]) for run in runs)) for v in variants},
        "instances": instances,
        "processes": processes,
        "process_ratios": ratios,
        "ratio_se": {v: ratio_over_processes(r)[1] for v, r in ratios.items()},
    }
