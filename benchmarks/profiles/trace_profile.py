"""Where a real model's first step goes without XLA: tracing, and the rest.

`benchmarks.real_models --parts compile` says how much longer keras_als's
first step takes than Keras's `LossScaleOptimizer`'s, with XLA and without.
This runs the first step without XLA (`real_models.architectures.build`:
mixed_float16, a TensorFlow graph, Adam, batch 8; the optimizer built first,
as `harness.scaling.prebuild` does, so the step is traced once) under Python's
profiler, and splits it into:

- `trace`: Python building the step's graph (the forward pass with its
  boundaries, backprop, the optimizer's phases);
- `graph`: TensorFlow optimizing that graph and running it once (the one call
  into TensorFlow's runtime, `TFE_Py_Execute`);

with the conditionals built while tracing (`cond_v2` calls: Keras's
apply-or-skip; keras_als's, one per group of crossing gradients and its
phases) and keras_als's functions that took the most of the trace. The
profiler slows Python down, both methods alike; compare the methods, not the
seconds with `--parts compile`'s.

    python -m benchmarks.profiles trace_profile --models resnet50_v2
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import keras

from benchmarks.harness.scaling import prebuild
from benchmarks.real_models.architectures import (
    MODELS,
    OTHER_FAMILIES,
    build,
    builder,
    data,
    train_on_batch,
)

METHODS = ("keras", "keras_als")


def first_step(name: str, method: str, top: int = 8) -> dict:
    """Model `name`'s first step without XLA for `method`, under the profiler:
    seconds in all, in `trace` and in `graph` (see the module docstring), the
    conditionals traced, and the `top` keras_als functions by time in them."""
    keras.utils.clear_session()
    model, _ = build(name, method, jit=False)
    prebuild(model)
    x, y = data(name, 1)
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    train_on_batch(model, x, y)  # `data(name, 1)`: one batch
    profile.disable()
    seconds = time.perf_counter() - start
    keras.config.set_dtype_policy("float32")
    stats = pstats.Stats(profile).stats
    graph = sum(s[3] for (_, _, f), s in stats.items() if "TFE_Py_Execute" in f)
    conditionals = sum(s[1] for (path, _, f), s in stats.items() if _is_cond_v2(path, f))
    ours = sorted(
        (
            (s[3], f"{path.split('/keras_als/')[-1]}:{f}")
            for (path, _, f), s in stats.items()
            if "/keras_als/" in path
        ),
        reverse=True,
    )
    return {
        "seconds": seconds,
        "trace": seconds - graph,
        "graph": graph,
        "conditionals": conditionals,
        "keras_als": [(where, round(t, 2)) for t, where in ours[:top]],
    }


def _is_cond_v2(path: str, function: str) -> bool:
    return path.endswith("cond_v2.py") and function == "cond_v2"


def table(name: str, rows: dict) -> str:
    """The rows of `first_step` for both methods, as markdown."""
    lines = [
        f"{name}, first step without XLA under the profiler (s)",
        "",
        "| method | first step | trace | graph | conditionals |",
        "| --- | --- | --- | --- | --- |",
    ]
    for method, row in rows.items():
        lines.append(
            f"| {method} | {row['seconds']:.1f} | {row['trace']:.1f} | {row['graph']:.1f} "
            f"| {row['conditionals']} |"
        )
    lines += ["", "keras_als's functions by time in them (s, nested calls counted in each):"]
    lines += [f"- {where}: {t}" for where, t in rows["keras_als"]["keras_als"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.profiles trace_profile", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--models",
        default="resnet50_v2",
        help=f"comma-separated, of {', '.join([*MODELS, *OTHER_FAMILIES])}",
    )
    parser.add_argument("--top", type=int, default=8, help="keras_als functions listed")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    for name in names:  # every name checked before the first, minutes-long profile
        try:
            builder(name)
        except ValueError as error:
            parser.error(str(error))
    for name in names:
        rows = {method: first_step(name, method, args.top) for method in METHODS}
        print(table(name, rows), flush=True)


if __name__ == "__main__":
    main()
