"""Where a real model's training step spends its time, from TensorFlow's profiler.

`benchmarks.real_models --parts step` says how much slower keras_als's step
is than Keras's `LossScaleOptimizer`'s, not where. This runs the same
compiled steps (`real_models.architectures.build`: mixed_float16, XLA, Adam, batch 8),
`instances` of each of `VARIANTS` (none of them the first model the process
built: `real_models.timing.discard_first_build`), steps interleaved in a shuffled
order, under the profiler, and splits each step's wall time into:

- `program`: XLA running the compiled step (`CpuExecutable::ExecuteAsyncOnStream`:
  its kernels and the waits between them);
- `launch`: TensorFlow calling the compiled function around that (the
  eager `EagerLocalExecute` of the step function, less the program: finding
  the executable, its arguments and outputs, copying the inputs);
- `python`: the rest (`train_on_batch`'s Python and the batch's conversion).

The program's kernels are traced too (`--xla_cpu_enable_xprof_traceme`,
which `main` adds to `XLA_FLAGS` before XLA compiles anything in the
process), and their self time is summed by kind: the instruction's name
without its number (`convert_multiply_fusion`, `convolution`, `cond`). Kinds
that only keras_als's program has, or only Keras's, are what its optimizer
and boundaries changed; a kind both have can move between two compiled
instances of one configuration, as `wrapper_only` and `keras_spread` show.

The profiler's own tracing makes every step slower; the parts are compared
between the optimizers, both profiled alike.

    python -m benchmarks.profiles step_profile --models gpt2_tiny,mobilenet_v2

A model of the cost study at real size (`benchmarks.cost_at_size`: DenseNet121,
ConvNeXtTiny, ...) is built and stepped as that study does (its inputs, batch
and SGD, its warm-up), so that a ratio of its table can be taken apart:

    python -m benchmarks.profiles step_profile --models densenet121

writes `results/step_profile_at_size.{json,md}` (`--out` to change it).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import glob
import json
import os
import random
import re
import statistics
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: E402

from benchmarks.cost_at_size import measure as cost_measure  # noqa: E402
from benchmarks.cost_at_size import plan as cost_plan  # noqa: E402
from benchmarks.harness import isolation  # noqa: E402
from benchmarks.real_models import architectures, timing  # noqa: E402

VARIANTS = {
    "keras": {"method": "keras"},
    "keras_als": {"method": "keras_als"},
    "wrapper_only": {"method": "keras", "wrap": True},
    "optimizer_only": {"method": "keras_als", "wrap": False},
}
"""What is profiled: `real_models.architectures.build`'s arguments. `wrapper_only`, the
wrapped model with Keras's optimizer, compiles to the plain model's program
(`real_models.programs.same_program`), so where it differs from `keras` is what two
compiled instances of one program differ by; `optimizer_only` is keras_als's
optimizer on the model not wrapped."""
PARTS = ("step", "python", "launch", "program")
PROGRAM = "CpuExecutable::ExecuteAsyncOnStream"
CALL = re.compile(r"EagerLocalExecute: __inference_one_step_on_data_\d+$")
KERNEL = re.compile(r"^(?!end: )[a-z][\w\-]*(?:\.\d+)?$")
"""An XLA instruction's name (`convert_multiply_fusion.12`); other events are
TensorFlow's own (`EagerExecute`, `ThunkExecutor::Execute`), and `end: ...`
marks where an asynchronous one ends."""


def profile(name: str, rounds: int = 40, instances: int = 2, seed: int = 0) -> dict:
    """Profiles `rounds` steps of `instances` compiled instances of each of
    `VARIANTS` on model `name` (after 3 warm-up steps each; a model of the cost
    study, `AT_SIZE`, after the study's warm-up) and splits their time (`split`)."""
    x, y, warmed_up = _at_size(name) if name in AT_SIZE else _real_model(name, seed)
    models = {}
    for k in range(instances):
        for variant in isolation.in_build_order(tuple(VARIANTS), k):
            models[f"{variant}/{k}"] = warmed_up(**VARIANTS[variant])
    order = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="keras_als_profile_") as logdir:
        tf.profiler.experimental.start(logdir)
        for i in range(rounds):
            for key in order.sample(list(models), len(models)):
                with tf.profiler.experimental.Trace(f"step:{key}", step_num=i):
                    architectures.train_on_batch(models[key], x, y)
        tf.profiler.experimental.stop()
        (path,) = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
        space = xplane_pb2.XSpace()
        with open(path, "rb") as f:
            space.ParseFromString(f.read())
    return summarize(split(space), instances)


AT_SIZE = (*cost_plan.MODELS, *cost_plan.SWEEP)
"""The cost study's models (`benchmarks.cost_at_size`), profiled at its settings:
its inputs and batch, SGD, `WARMUP` steps before any is profiled."""


def _real_model(name: str, seed: int):
    """`real_models`' data and warm-up for model `name` (its first build discarded)."""
    x, y = architectures.data(name, 1, seed)
    timing.discard_first_build(name, x, y, seed)
    return x, y, lambda **arguments: timing.warmed_up(name, x, y, seed, **arguments)


def _at_size(name: str):
    """The cost study's data and warm-up for its model `name`, after the study's
    untimed compile of a tiny model of each method (`measure.warm_up_process`)."""
    x, y = cost_plan.data(name)

    def warmed_up(method: str, wrap: bool | None = None) -> keras.Model:
        model, _ = cost_measure.build(name, method, wrap)
        for _ in range(cost_plan.WARMUP):
            cost_measure.step(model, x, y)
        return model

    cost_measure.warm_up_process()
    return x, y, warmed_up


def split(space) -> dict[str, list[dict[str, float]]]:
    """Per instance (`"method/k"`), per profiled step: microseconds in each of
    `PARTS` and, as `"kernel:<kind>"`, the self time of each kind of XLA kernel."""
    lines = []
    for plane in space.planes:
        names = {k: m.name for k, m in plane.event_metadata.items()}
        for line in plane.lines:
            base = line.timestamp_ns * 1000
            events = sorted(
                (base + e.offset_ps, e.duration_ps, names.get(e.metadata_id, ""))
                for e in line.events
            )
            lines.append(([e[0] for e in events], events))
    steps = collections.defaultdict(list)
    for _, events in lines:
        for start, duration, name in events:
            if name.startswith("step:"):
                steps[name[5:]].append(_parts_of(lines, start, start + duration))
    return dict(steps)


def _parts_of(lines, start: int, end: int) -> dict[str, float]:
    """The parts of the step that ran from `start` to `end` (picoseconds)."""
    parts = collections.Counter({"step": (end - start) / 1e6})
    within = [_within(starts, events, start, end) for starts, events in lines]
    programs = []
    for events in within:
        for begin, duration, name in events:
            if CALL.match(name):
                parts["launch"] += duration / 1e6
            elif name == PROGRAM:
                parts["program"] += duration / 1e6
                programs.append((begin, begin + duration))
    for events in within:
        for i, (begin, duration, name) in enumerate(events):
            if KERNEL.match(name) and any(a <= begin < b for a, b in programs):
                kind = "kernel:" + re.sub(r"\.\d+$", "", name)
                parts[kind] += (duration - _children(events, i)) / 1e6
    parts["launch"] -= parts["program"]
    parts["python"] = parts["step"] - parts["launch"] - parts["program"]
    return dict(parts)


def _within(starts, events, start: int, end: int) -> list:
    """The events of one line (sorted by start; `starts`, their start times)
    that ran within `start` to `end`."""
    low, high = bisect.bisect_left(starts, start), bisect.bisect_right(starts, end)
    return [e for e in events[low:high] if e[0] + e[1] <= end and not e[2].startswith("step:")]


def _children(events, i: int) -> int:
    """Time of the kernels directly inside kernel `events[i]` on its line (sorted
    by start): a conditional's branches; a dot's library call stays its own."""
    begin, duration, _ = events[i]
    end, covered, total = begin + duration, begin, 0
    for start, length, name in events[i + 1 :]:
        if start >= end:
            break
        if start >= covered and KERNEL.match(name):  # not inside an earlier child
            total += length
            covered = start + length
    return total


def summarize(steps: dict, instances: int) -> dict:
    """Per variant, each part's mean over instances of the median over steps
    (us); each variant's difference from Keras's; and how far Keras's
    instances differ (largest minus smallest median: two instances of one
    configuration)."""
    medians = {}
    for key, profiled in steps.items():
        names = set().union(*profiled)
        medians[key] = {n: statistics.median(s.get(n, 0.0) for s in profiled) for n in names}
    names = sorted(set().union(*medians.values()))
    per_variant = {
        v: {
            n: statistics.mean(medians[f"{v}/{k}"].get(n, 0.0) for k in range(instances))
            for n in names
        }
        for v in VARIANTS
    }
    keras_each = [medians[f"keras/{k}"] for k in range(instances)]
    keras = per_variant["keras"]
    return {
        "instances": instances,
        "us": per_variant,
        "difference_us": {v: {n: us[n] - keras[n] for n in names} for v, us in per_variant.items()},
        "keras_spread_us": {
            n: max(m.get(n, 0.0) for m in keras_each) - min(m.get(n, 0.0) for m in keras_each)
            for n in names
        },
    }


def markdown(results: dict, kernels: int = 8) -> str:
    """One table per model: the parts, then the kernel kinds keras_als moved most."""
    at_size = all(name in AT_SIZE for name in results["models"])
    steps = (
        "the steps of the cost study, `benchmarks.cost_at_size` (mixed_float16, XLA, SGD, "
        "its inputs and batch)"
        if at_size
        else "the steps of `benchmarks.real_models` (mixed_float16, XLA, Adam, batch 8)"
    )
    lines = [
        "# Where the step time goes" + (" at real size (issue 79)" if at_size else " (issue 12)"),
        "",
        f"`python -m benchmarks.profiles step_profile`: {steps} under TensorFlow's profiler, "
        "which slows "
        "every step; median microseconds per step, the mean over compiled instances of "
        "each variant, and each variant's difference from Keras's. `program`: XLA running "
        "the compiled step; `launch`: TensorFlow calling it; `python`: the rest of "
        "`train_on_batch`. Kernel kinds: self time of the XLA instructions of that kind, "
        "those keras_als moved most. `wrapper_only` (the wrapped model, Keras's optimizer) "
        "compiles to the plain model's program: its difference is what two instances of "
        "one program differ by, as is the Keras spread (largest minus smallest Keras "
        "instance). `optimizer_only`: keras_als's optimizer, the model not wrapped.",
    ]
    for name, result in results["models"].items():
        us, difference = result["us"], result["difference_us"]
        spread = result["keras_spread_us"]
        lines += [
            "",
            f"## {name} ({result['instances']} instances of each"
            + (", the cost study's settings)" if name in AT_SIZE else ")"),
            "",
            "| part | Keras (us) | keras_als | wrapper_only | optimizer_only | Keras spread |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        moved = sorted(
            (n for n in us["keras"] if n.startswith("kernel:")),
            key=lambda n: -abs(difference["keras_als"][n]),
        )
        for part in (*PARTS, *moved[:kernels]):
            others = " | ".join(f"{difference[v][part]:+.0f}" for v in list(VARIANTS)[1:])
            lines.append(f"| {part} | {us['keras'][part]:.0f} | {others} | {spread[part]:.0f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gpt2_tiny,mobilenet_v2")
    parser.add_argument("--rounds", type=int, default=40, help="profiled steps per instance")
    parser.add_argument("--instances", type=int, default=2, help="compiled instances of each")
    parser.add_argument(
        "--out", help="path without suffix (default: results/step_profile[_at_size])"
    )
    args = parser.parse_args(argv)
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_enable_xprof_traceme=true".strip()
    results = {"models": {}}
    names = args.models.split(",")
    if args.out is None:
        at_size = all(name in AT_SIZE for name in names)
        args.out = "benchmarks/results/step_profile" + ("_at_size" if at_size else "")
    for name in names:
        if name not in AT_SIZE:
            architectures.builder(name)  # an unknown name fails before any run
    for name in names:
        result = profile(name, args.rounds, args.instances)
        results["models"][name] = result
        parts = ", ".join(f"{p} {result['difference_us']['keras_als'][p]:+.0f} us" for p in PARTS)
        print(f"{name:14s} keras_als - Keras per step: {parts}", flush=True)
    text = markdown(results)
    print(text)
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(text)


if __name__ == "__main__":
    tf.get_logger().setLevel("ERROR")
    main()
