"""Where a compiled first step goes: tracing, TensorFlow-to-XLA, XLA, the run.

The cost study (`benchmarks.cost_at_size`) times the whole first step of a
real-size model, keras_als against Keras's `LossScaleOptimizer`. This splits
it. Each model of the study is built from its constructor (mixed_float16, SGD,
its batch), and a custom training step (`harness.xla_step.compiled_step`,
`jit_compile=True`) is timed in four parts:

- `trace`: Python building the step's graph (`get_concrete_function`);
- `bridge`: TensorFlow lowering that graph to XLA's program
  (`experimental_get_compiler_ir(...)(stage="hlo")`);
- `xla`: XLA optimizing and compiling the program: the first call, less the
  bridge (which the first call runs again) and one run;
- `run`: the second call.

It also counts the graph's operations (nested functions included), the
compiled program's fusions, and its kernels: the fusions left after those
that compute the same thing are counted once, which is what XLA's CPU
backend compiles (a fusion that reads a scalar sliced out of a vector at
its own offset is a kernel of its own).

Variants: `keras` (Keras's optimizer, the model as built), `wrapper_only`
(the model wrapped, Keras's optimizer), `optimizer_only` (keras_als's
optimizer, the model not wrapped), `keras_als`, and keras_als under an
ablation of `harness.ablations` (`no_crossing_reductions`,
`no_boundary_rescaling`). Each variant is measured twice, in the order
given and then reversed, in one process after an untimed warm-up compile;
a part is the mean of the two, with half their difference.

    python -m benchmarks.profiles first_step --models vit_base
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.cost_at_size import plan  # noqa: E402
from benchmarks.harness import ablations, provenance, scaling  # noqa: E402
from benchmarks.harness.xla_step import compiled_step  # noqa: E402
from benchmarks.profiles.step_program import dump_programs, new_step_program, normalized  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "first_step")
VARIANTS = (
    "keras",
    "wrapper_only",
    "optimizer_only",
    "keras_als",
    "no_crossing_reductions",
    "no_boundary_rescaling",
    "constant_offsets",
)
PARTS = ("trace", "bridge", "xla", "run")
_ABLATIONS = {
    "no_crossing_reductions": ablations.without_crossing_reductions,
    "no_boundary_rescaling": ablations.without_boundary_rescaling,
    "constant_offsets": ablations.constant_offsets,
}


def operations(graph) -> int:
    """Operations of `graph` and of every function it calls (each counted once)."""
    seen: set[str] = set()

    def count(g) -> int:
        total = len(g.get_operations())
        for name, function in getattr(g, "_functions", {}).items():
            if name not in seen and getattr(function, "graph", None) is not None:
                seen.add(name)
                total += count(function.graph)
        return total

    return count(graph)


def kernels(program: str) -> tuple[int, int]:
    """(fusions, distinct fusions) of an optimized HLO text: fusions whose
    computations are equal but for names are counted once as kernels."""
    bodies = collections.Counter()
    for match in re.finditer(r"^%((?:fused|wrapped)_\S*) .*?^}", program, flags=re.M | re.S):
        bodies[normalized(match.group(0).split("\n", 1)[1])] += 1
    return sum(bodies.values()), len(bodies)


def _build(name: str, variant: str):
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    model = plan.builder(name)()
    inner = keras.optimizers.SGD(plan.LEARNING_RATE)
    wrap = variant not in ("keras", "optimizer_only")
    adaptive = variant not in ("keras", "wrapper_only")
    model, optimizer = scaling.loss_scaled(model, inner, wrap=wrap, adaptive=adaptive)
    optimizer.build(model.trainable_variables)
    hub = hasattr(model, "backbone")  # KerasHub tasks return logits; applications softmax
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=hub)
    return compiled_step(model, optimizer, loss)


def measure_once(name: str, variant: str, x, y, folder: str, seen: set[str]) -> dict:
    """One first step of `variant` on model `name`, split into `PARTS`."""
    step = _build(name, variant)
    ablation = _ABLATIONS.get(variant)
    with ablation() if ablation else contextlib.nullcontext():
        start = time.perf_counter()
        traced = step.get_concrete_function(x, y)
        traced_at = time.perf_counter()
        step.experimental_get_compiler_ir(x, y)(stage="hlo")
        bridged_at = time.perf_counter()
        step(x, y)
        first_at = time.perf_counter()
    step(x, y)
    run = time.perf_counter() - first_at
    bridge = bridged_at - traced_at
    fusions, distinct = kernels(new_step_program(folder, seen, "train_step"))
    return {
        "trace": traced_at - start,
        "bridge": bridge,
        "xla": max(first_at - bridged_at - bridge - run, 0.0),
        "run": run,
        "operations": operations(traced.graph),
        "fusions": fusions,
        "kernels": distinct,
    }


def measure(name: str, variants: list[str], folder: str) -> list[dict]:
    """Every variant on model `name`, twice (ABBA), after an untimed warm-up."""
    x, y = plan.data(name)
    seen: set[str] = set()
    _warm_up(folder, seen)
    runs = collections.defaultdict(list)
    for variant in [*variants, *reversed(variants)]:
        runs[variant].append(measure_once(name, variant, x, y, folder, seen))
        print(f"{name} {variant}: {runs[variant][-1]}", flush=True)
    rows = []
    for variant in variants:
        a, b = runs[variant]
        row = {"model": name, "variant": variant}
        for part in PARTS:
            row[part] = statistics.mean([a[part], b[part]])
            row[f"{part}_spread"] = abs(a[part] - b[part]) / 2
        row.update({k: a[k] for k in ("operations", "fusions", "kernels")})
        rows.append(row)
    return rows


def _warm_up(folder: str, seen: set[str]) -> None:
    """Compiles a tiny model's step once, untimed: the first compile of a
    process pays for starting XLA."""
    keras.config.set_dtype_policy("mixed_float16")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    step = compiled_step(model, optimizer, keras.losses.SparseCategoricalCrossentropy())
    step(tf.ones([2, 4]), tf.zeros([2], "int32"))
    new_step_program(folder, seen, "train_step")


def render(saved: dict) -> str:
    """The markdown table of a saved run: each part in seconds, the total over
    Keras's, the operations, fusions and kernels."""
    lines = [
        *provenance.header(
            saved,
            "A compiled first step, split into its parts",
            "benchmarks/profiles/first_step.py",
        ),
        "",
        "Seconds: the mean of two first steps, ± half their difference.",
        "",
        "| model | variant | trace | bridge | xla | run | total / Keras | operations "
        "| fusions | kernels |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    keras_total = {
        r["model"]: sum(r[p] for p in PARTS) for r in saved["rows"] if r["variant"] == "keras"
    }
    for r in saved["rows"]:
        parts = " | ".join(f"{r[p]:.2f} ± {r[p + '_spread']:.2f}" for p in PARTS)
        total = sum(r[p] for p in PARTS)
        ratio = f"{total / keras_total[r['model']]:.2f}" if r["model"] in keras_total else "-"
        lines.append(
            f"| {r['model']} | {r['variant']} | {parts} | {ratio} | {r['operations']} "
            f"| {r['fusions']} | {r['kernels']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    """Measures the variants on each model; prints and saves the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="vit_base", help="comma-separated, of the study's")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args(argv)
    names, variants = args.models.split(","), args.variants.split(",")
    for name in names:
        if name not in plan.MODELS and name not in plan.SWEEP:
            parser.error(f"Unknown model {name!r}; choose from {', '.join(plan.MODELS)}.")
    for variant in variants:
        if variant not in VARIANTS:
            parser.error(f"Unknown variant {variant!r}; choose from {', '.join(VARIANTS)}.")
    folder = dump_programs()
    rows = [row for name in names for row in measure(name, variants, folder)]
    command = provenance.recorded_command("benchmarks.profiles first_step", argv or [])
    print(render(provenance.save(args.out, command, {"rows": rows}, render)))


if __name__ == "__main__":
    main()
