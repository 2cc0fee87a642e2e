"""Step time of keras_als over Keras's `LossScaleOptimizer`, measured interleaved.

Both methods train the same model (same weights, same batch) with the same
custom step, compiled with `jit_compile=True` (XLA). Each method is built
`instances` times (a fresh model, optimizer and compiled step each): on this
CPU one compiled instance can run a few percent faster or slower than another
of the same configuration for as long as it lives, so one instance per
method would compare those draws rather than the methods. After warm-up,
every round times one block of every instance, in a shuffled order, in one
process, so that load from other processes hits all alike; the ratio is the
median over rounds of `mean time(keras_als instances) / mean time(Keras LSO
instances)`. The same measurement on MLPs with 10, 50 and 200 wrapped layers
shows how the overhead grows with the number of layers.

    python -m benchmarks.suite.cost --models transformer,residual_cnn --sweep 200 --blocks 16

times chosen models (with the breakdown variants: `BREAKDOWN`, written to
`results/step_breakdown.md`, which RESULTS.md takes in) and sweep sizes on
their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import sys
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from benchmarks.harness import ablations, isolation, provenance, scaling, stats, xla_step, zoo
from benchmarks.suite import tables
from benchmarks.suite.records import Timing
from keras_als import policies
from keras_als.step import _entries


def deep_mlp(depth: int, width: int = 64, features: int = 32) -> Callable[[], keras.Model]:
    """A builder of `depth` Dense(width, tanh) layers plus a Dense(1) head."""

    def build() -> keras.Model:
        return keras.Sequential(
            [keras.Input((features,))]
            + [keras.layers.Dense(width, activation="tanh") for _ in range(depth)]
            + [keras.layers.Dense(1)]
        )

    return build


TIMING_MODELS = ("cnn_batchnorm", "residual_cnn", "transformer", "deep_mlp")
"""The models of the step-time table (the layer sweep adds `mlp_N`)."""


def model_named(name: str) -> tuple[Callable[[], keras.Model], np.ndarray, np.ndarray]:
    """`(builder, x, y)` of a timing model, or of `mlp_N`: N wrapped Dense(64, tanh) layers."""
    rng = np.random.default_rng(0)
    if name.startswith("mlp_"):
        x = rng.normal(size=(64, 32)).astype("float32")
        y = rng.normal(size=(64, 1)).astype("float32")
        return deep_mlp(int(name[4:]) - 1), x, y
    if name in ("cnn_batchnorm", "residual_cnn"):
        x_digits, y_digits, _, _ = zoo.digits_data()
        builder = zoo.digits_cnn if name == "cnn_batchnorm" else zoo.residual_cnn
        return builder, x_digits[:64], y_digits[:64].astype("float32")
    if name == "transformer":
        tokens = rng.integers(0, 64, size=(64, 16)).astype("int32")
        return zoo.transformer_encoder, tokens, rng.integers(0, 4, 64).astype("float32")
    if name == "deep_mlp":
        x = rng.normal(size=(64, 32)).astype("float32")
        return lambda: zoo.mlp(8, 64, 32, 8, "relu"), x, rng.integers(0, 8, 64).astype("float32")
    raise ValueError(f"unknown timing model {name!r}: use one of {TIMING_MODELS} or mlp_N")


def loss_for(y: np.ndarray, model: keras.Model) -> keras.losses.Loss:
    """Sparse cross-entropy for a multi-output head, else mean squared error."""
    if model.outputs[0].shape[-1] > 1:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return keras.losses.MeanSquaredError()


def _time_block(step: Callable, x: tf.Tensor, y: tf.Tensor, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        loss = step(x, y)
    loss.numpy()
    return (time.perf_counter() - start) / n


BREAKDOWN = (
    scaling.Method(
        "als_every_step",
        "als",
        policies.MaxSafe(),
        wrap=True,
        measure_every_n_steps=1,
        label="keras_als, MaxSafe, measuring every step (measure_every_n_steps=1)",
    ),
    scaling.Method(
        "als_fixed_global",
        "als",
        policies.Fixed(default=2.0**10),
        wrap=False,
        initial_scale=2.0**10,
        label="keras_als unwrapped, Fixed policy: one global scale",
    ),
    scaling.Method(
        "als_no_crossing_reductions",
        "als",
        policies.MaxSafe(),
        wrap=True,
        label="keras_als, MaxSafe, without the crossing gradients' reductions (ablation: "
        "costing only, its scales come from the weight gradients alone)",
    ),
    scaling.Method(
        "als_crossings_never_wait",
        "als",
        policies.MaxSafe(),
        wrap=True,
        label="keras_als, MaxSafe, no crossing gradient waiting for its group's reductions "
        "(ablation: the schedule before a gradient that fills a group alone waited)",
    ),
)
"""Extra variants that split keras_als's overhead into its parts."""


def interleaved(
    name: str,
    blocks: int,
    steps_per_block: int,
    extra: tuple[scaling.Method, ...] = (),
    instances: int = 3,
) -> list[Timing]:
    """Times keras_als (max_safe, and `extra` variants) against Keras LSO, interleaved.

    Runs in the calling process; `isolation.in_fresh_process` runs it in a new one.

    Args:
        name: The model (see `model_named`).
        blocks: Rounds; each round times one block of every instance of every
            method, in a shuffled order.
        steps_per_block: Steps per block.
        extra: More keras_als variants timed in the same rounds.
        instances: Instances built of each method.

    Returns:
        One `Timing` per keras_als variant, each against Keras LSO.
    """
    builder, x, y = model_named(name)
    isolation.fresh_session()
    isolation.set_seed(0)
    with scaling.precision("float32"):
        weights = builder().get_weights()
    methods = (scaling.KERAS_LSO, scaling.ALS_MAX_SAFE, *extra)
    steps = []  # (method name, compiled step), `instances` of each method
    wrapped = 0
    # The first model a process compiles runs faster than later ones of the same
    # configuration (`real_models.discard_first_build`): one of Keras's goes first,
    # untimed, and every other group builds the methods in reverse order.
    first = scaling.KERAS_LSO.build(builder, weights, keras.optimizers.Adam(1e-4))
    untimed = xla_step.compiled_step(*first, loss_for(y, first[0]))
    for k in range(instances):
        for method in isolation.in_build_order(methods, k):
            model, optimizer = method.build(builder, weights, keras.optimizers.Adam(1e-4))
            if method.wrap:
                wrapped = len(_entries.owners(model.trainable_variables))  # scaled layers
            step = xla_step.compiled_step(model, optimizer, loss_for(y, model))
            steps.append((method.name, step))
    x, y = tf.constant(x), tf.constant(y)
    _time_block(untimed, x, y, 3)
    for method_name, step in steps:
        with _traced_for(method_name):
            _time_block(step, x, y, 3)  # trace, compile, settle
    order = random.Random(0)
    times = [[] for _ in steps]  # per instance, one time per round
    for _ in range(blocks):
        for i in order.sample(range(len(steps)), len(steps)):
            times[i].append(_time_block(steps[i][1], x, y, steps_per_block))
    per_method = {
        m.name: np.mean([t for (n, _), t in zip(steps, times) if n == m.name], axis=0)
        for m in methods
    }  # per round, the mean over the method's instances
    lso = per_method["keras_lso"]
    medians = {
        m.name: [float(np.median(t)) for (n, _), t in zip(steps, times) if n == m.name]
        for m in methods
    }  # per instance, its median block time
    lso_medians = medians["keras_lso"]
    return [
        Timing(
            name,
            m.name,
            wrapped,
            1e3 * float(np.median(per_method[m.name])),
            1e3 * float(np.median(lso)),
            float(np.median(per_method[m.name] / lso)),
            blocks,
            steps_per_block,
            instances,
            float(max(lso_medians) / min(lso_medians)),
            stats.ratio_and_standard_error(medians[m.name], lso_medians)[1],
        )
        for m in methods[1:]
    ]


ABLATION_OF = {
    "als_no_crossing_reductions": "no_crossing_reductions",
    "als_crossings_never_wait": "crossings_never_wait",
}
"""The breakdown variants that are ablations (`harness.ablations.NAMED`)."""


def _traced_for(method_name: str) -> contextlib.AbstractContextManager:
    """What the step of `method_name` is traced inside: its ablation, if it is one."""
    return ablations.named(ABLATION_OF.get(method_name, ""))


def layer_sweep(
    sizes: tuple[tuple[int, int], ...],
    blocks: int,
    steps_per_block: int,
    log: Callable[[str], None] = print,
) -> list[Timing]:
    """Interleaved timing on MLPs with each number of wrapped layers in `sizes`.

    Args:
        sizes: `(wrapped layers, instances of each method)` pairs.
        blocks: Rounds.
        steps_per_block: Steps per block.
        log: Prints one line per size.
    """
    results = []
    for layers, instances in sizes:
        start = time.perf_counter()
        (timing,) = isolation.in_fresh_process(
            interleaved, f"mlp_{layers}", blocks, steps_per_block, (), instances
        )
        log(_line(timing) + f" [{time.perf_counter() - start:.0f}s]")
        results.append(timing)
    return results


def _line(t: Timing) -> str:
    return (
        f"  {t.model:14s} {t.method:18s} {t.layers:4d} wrapped layers: {t.als_ms:.2f} ms, "
        f"Keras LSO {t.lso_ms:.2f} ms, ratio {t.ratio:.3f} ± {t.ratio_se:.3f} "
        f"(Keras LSO instances differ by {t.lso_spread:.3f}x)"
    )


def run_all(
    blocks: int,
    steps_per_block: int,
    breakdown: bool = True,
    models: tuple[str, ...] | None = None,
    log: Callable[[str], None] = print,
    instances: int = 3,
) -> list[Timing]:
    """The step-time table on the timing models (all, or those named in `models`)."""
    results = []
    for name in TIMING_MODELS:
        if models is not None and name not in models:
            continue
        start = time.perf_counter()
        extra = BREAKDOWN if breakdown else ()
        timings = isolation.in_fresh_process(
            interleaved, name, blocks, steps_per_block, extra, instances
        )
        for timing in timings:
            log(_line(timing))
        log(f"  ({name}: {time.perf_counter() - start:.0f}s)")
        results += timings
    return results


BREAKDOWN_RESULTS = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "results", "step_breakdown"
)
"""Where `--models` writes its JSON and markdown (`.json`, `.md`)."""


def breakdown_markdown(saved: dict) -> str:
    """The markdown of a saved `--models` run: how it was made, the variants,
    then the table of every variant against Keras LSO."""
    labels = {m.name: m.label for m in (scaling.ALS_MAX_SAFE, *BREAKDOWN)}
    lines = [
        "# Step time, split by variant",
        "",
        f"Generated by `{saved['command']}` (never edit by hand): the step-time table's "
        "models, each in a fresh process, every variant interleaved with Keras LSO's "
        "instances in the same rounds (XLA). The variants (`BREAKDOWN` in "
        "`benchmarks/suite/cost.py`):",
        "",
        *(f"- `{name}`: {label}" for name, label in labels.items()),
        "",
        f"- Date: {saved['date']}",
        f"- keras_als measured: {saved['provenance']}",
        f"- Environment: {saved['environment']}",
        "",
        tables.cost_table([Timing(**t) for t in saved["timings"]]),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """Times chosen models and sweep sizes alone, without the whole suite."""
    import argparse

    parser = argparse.ArgumentParser(description="Step time of keras_als over Keras LSO (XLA).")
    parser.add_argument(
        "--models",
        default="",
        help="comma-separated timing models, e.g. transformer,residual_cnn (default: none)",
    )
    parser.add_argument("--sweep", default="", help="comma-separated layer counts, e.g. 200")
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    parser.add_argument("--instances", type=int, default=3, help="instances of each method")
    parser.add_argument(
        "--out",
        default=BREAKDOWN_RESULTS,
        help="--models writes OUT.md and OUT.json (default: the committed run)",
    )
    args = parser.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    if models:
        timings = run_all(args.blocks, args.steps, True, models, instances=args.instances)
        command = " ".join(["python -m benchmarks.suite.cost", *(argv or sys.argv[1:])])
        timings_saved = {"timings": [dataclasses.asdict(t) for t in timings]}
        provenance.save(args.out, command, timings_saved, breakdown_markdown)
        print(f"wrote {args.out}.md", flush=True)
    depths = tuple(int(d) for d in args.sweep.split(",") if d)
    if depths:
        layer_sweep(tuple((d, args.instances) for d in depths), args.blocks, args.steps)


if __name__ == "__main__":
    main()
