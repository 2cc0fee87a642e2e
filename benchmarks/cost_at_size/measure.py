"""One model's measurements, in this process:
`python -m benchmarks.cost_at_size.measure NAME OUT [ABLATION]`.

Run by `command` in a fresh process whose `XLA_FLAGS` dump the compiled
programs' buffer assignments into `DUMP` (set before TensorFlow starts).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time

import keras

from benchmarks.cost_at_size import plan
from benchmarks.harness import ablations, scaling, xla_memory

METHODS = ("keras", "keras_als")
"""The methods compared; an ablation of keras_als (`harness.ablations`) may join them."""


def build_order(methods: tuple[str, ...]) -> tuple[str, ...]:
    """`methods`, then the same reversed: no method always compiles first (ABBA)."""
    return tuple(methods) + tuple(reversed(methods))


def build(
    name: str, method: str, wrap: bool | None = None
) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """Model `name` for `method`, compiled with XLA, from the same initial weights."""
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    return compiled(plan.builder(name)(), method, wrap)


def compiled(
    model: keras.Model, method: str, wrap: bool | None = None
) -> tuple[keras.Model, keras.optimizers.Optimizer]:
    """`model` compiled with XLA and `method`'s optimizer, instrumented if
    `wrap` (None: for a keras_als method)."""
    adaptive = method.startswith("keras_als")
    inner = keras.optimizers.SGD(plan.LEARNING_RATE)
    wrap = adaptive if wrap is None else wrap
    model, optimizer = scaling.loss_scaled(model, inner, wrap=wrap, adaptive=adaptive)
    if hasattr(model, "backbone"):  # a KerasHub task: its own loss and metrics
        model.compile(optimizer=optimizer, jit_compile=True)
    else:
        loss = keras.losses.SparseCategoricalCrossentropy()
        model.compile(optimizer=optimizer, loss=loss, jit_compile=True)
    return model, optimizer


def step(model: keras.Model, x, y) -> None:
    keras.Model.train_on_batch(model, x, y)  # KerasHub's override converts y (see real_models)


def peak_of_new_programs(dump: str, seen: set[str]) -> int | None:
    """XLA's peak bytes of the largest training-step program dumped since `seen`."""
    new = set(xla_memory.buffer_assignments(dump, "one_step_on_data")) - seen
    seen |= new
    return xla_memory.peak_of(sorted(new), "one_step_on_data") if new else None


def warm_up_process() -> None:
    """Compiles and steps a tiny model of each method, untimed: the first program a
    process compiles pays for starting XLA and loading what tracing imports, which
    would otherwise fall on the first instance built (Keras's)."""
    x, y = plan.data("densenet121")
    for method in METHODS:
        keras.config.set_dtype_policy("mixed_float16")
        model = keras.Sequential(
            [
                keras.Input(x.shape[1:]),
                keras.layers.Conv2D(4, 3),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10),
            ]
        )
        step(compiled(model, method)[0], x, y)


def measure(name: str, dump: str | None, ablation: str = "") -> dict:
    """The model's first steps, peaks and median steps, per method and instance;
    with `ablation`, keras_als with that part left out (`harness.ablations`) too,
    as method `keras_als:ABLATION`."""
    warm_up_process()
    x, y = plan.data(name)
    seen: set[str] = set()
    if dump:
        peak_of_new_programs(dump, seen)  # the warm-up's programs are seen, not counted
    methods = METHODS + ((f"keras_als:{ablation}",) if ablation else ())
    instances, boundaries = [], 0
    first, peak = {m: [] for m in methods}, {m: [] for m in methods}
    for method in build_order(methods):
        model, optimizer = build(name, method)
        start = time.perf_counter()
        with ablations.named(method.partition(":")[2]):  # the step is traced here
            step(model, x, y)
        first[method].append(time.perf_counter() - start)
        if dump:
            peak[method].append(peak_of_new_programs(dump, seen))
        if method == "keras_als":
            boundaries = len(optimizer.layer_scales()) - 1
        instances.append((method, model))
        print(f"{name}: {method} first step {first[method][-1]:.1f} s", flush=True)
    for _, model in instances:
        for _ in range(plan.WARMUP):
            step(model, x, y)
    times = [[] for _ in instances]
    order = random.Random(0)
    for _ in range(plan.ROUNDS):
        for k in order.sample(range(len(instances)), len(instances)):
            start = time.perf_counter()
            step(instances[k][1], x, y)
            times[k].append(time.perf_counter() - start)
    median = {
        m: [statistics.median(t) for (mm, _), t in zip(instances, times) if mm == m]
        for m in methods
    }
    variables = len(instances[0][1].trainable_variables)
    return {
        "model": name,
        "variables": variables,
        "scales": boundaries,
        "first_step": first,
        "peak_bytes": peak,
        "step": median,
    }


def main() -> int:
    name, out = sys.argv[1], sys.argv[2]
    ablation = sys.argv[3] if len(sys.argv) > 3 else ""
    result = measure(name, os.environ.get("KERAS_ALS_COST_DUMP"), ablation)
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
