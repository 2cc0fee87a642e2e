"""Peak memory of one compiled training step, keras_als against Keras's LSO.

TensorFlow keeps no allocator statistics for the CPU
(`tf.config.experimental.get_memory_info("CPU:0")` raises), and `tracemalloc`
sees Python objects only. So each configuration runs in its own subprocess
(`python -m benchmarks.suite.memory MODEL METHOD`), which measures two things:

- *XLA step memory*: XLA's buffer assignment for the compiled step (dumped
  with `XLA_FLAGS=--xla_dump_to`), "Total bytes used": parameters, temporaries
  and outputs of the step, which is what the step needs on a device; and
  the same dump's *peak usage*, the bytes live at once at the busiest point
  of the step's schedule. The total is larger: XLA packs the temporaries
  into one heap, with gaps between them.
- *Peak RSS*: the peak resident set (`VmHWM` in /proc/self/status) of the whole
  process after the steps, which includes the TensorFlow runtime, the XLA
  compiler and Python; its growth from before the first step is reported too.

The subprocess prints one JSON line; `measure` runs it and parses it.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

from benchmarks.harness import ablations

MODELS = ("cnn_batchnorm", "transformer", "mlp_50")
"""Models measured (names from `benchmarks.suite.cost`)."""

BREAKDOWN = (
    ("keras_lso", ""),
    ("als_max_safe", ""),
    ("als_max_safe", "no_crossing_reductions"),
    ("als_fixed_global", ""),
    ("keras_lso_instrumented", ""),
    ("als_max_safe", "crossings_reduced_last"),
    ("als_max_safe", "crossings_reduced_early"),
    ("als_max_safe", "crossings_never_wait"),
)
"""`--breakdown`'s variants, (method, ablation): Keras's optimizer; keras_als;
keras_als traced without the crossing gradients' reductions; keras_als's
optimizer on the model not instrumented, one scale (optimizer only); Keras's
optimizer on the instrumented model (instrumentation only); and three other
schedules of keras_als's crossing reductions: in one branch after backprop;
every group's branch run as soon as the group is complete; no branch run
before its results are read (keras_als makes a gradient that fills a group
alone wait for its branch, `keras_als._crossings`)."""


@dataclasses.dataclass
class Memory:
    """Memory of one model under one method.

    Attributes:
        model: Model name.
        method: `"keras_lso"` or `"als_max_safe"`.
        xla_bytes: XLA buffer assignment total of the compiled step (largest
            compiled version of the step).
        peak_rss_mb: Peak resident set size of the process, MiB.
        rss_growth_mb: Peak RSS minus RSS before the first step, MiB.
        xla_peak_bytes: Bytes live at once at the peak of the same step
            (XLA's "peak usage"); None in results saved before it was read.
    """

    model: str
    method: str
    xla_bytes: int
    peak_rss_mb: float
    rss_growth_mb: float
    xla_peak_bytes: int | None = None


def measure(model: str, method: str, steps: int = 20, ablation: str = "") -> Memory:
    """Runs one configuration in a fresh subprocess; returns what it measured,
    with `ablation` (of `harness.ablations.NAMED`, "" for none) left out of
    keras_als's step, to cost it."""
    command = [sys.executable, "-m", "benchmarks.suite.memory", model, method, str(steps), ablation]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"memory probe {model} {method} failed:\n{done.stderr[-3000:]}")
    return Memory(**json.loads(lines[-1]))


def breakdown(model: str, steps: int = 5) -> list[tuple[str, Memory]]:
    """`BREAKDOWN`'s variants of `model`, each in a fresh subprocess, named
    `method` or `method:ablation`. XLA's buffer assignment is the same in every
    process, so one process per variant is enough."""
    return [
        (f"{method}:{ablation}" if ablation else method, measure(model, method, steps, ablation))
        for method, ablation in BREAKDOWN
    ]


def breakdown_table(model: str, used: list[tuple[str, Memory]]) -> str:
    """Markdown: each variant's XLA step memory, total and at peak, in MiB and
    as a ratio to the first variant's (Keras's)."""
    reference = used[0][1]
    lines = [
        f"{model}: XLA step memory, MiB (ratio to {used[0][0]})",
        "",
        "| variant | total | at peak |",
        "| --- | --- | --- |",
    ]
    for name, m in used:
        lines.append(
            f"| {name} | {m.xla_bytes / 2**20:.2f} ({m.xla_bytes / reference.xla_bytes:.3f}x) "
            f"| {m.xla_peak_bytes / 2**20:.2f} "
            f"({m.xla_peak_bytes / reference.xla_peak_bytes:.3f}x) |"
        )
    return "\n".join(lines)


BREAKDOWN_RESULTS = os.path.join(
    os.path.dirname(os.path.dirname(__file__)), "results", "memory_breakdown"
)
"""Where `--breakdown` writes its JSON and markdown (`.json`, `.md`)."""


def breakdown_markdown(saved: dict) -> str:
    """The markdown of a saved `--breakdown` run: how it was made, then one
    `breakdown_table` per model."""
    lines = [
        "# Step memory, split by variant",
        "",
        f"Generated by `{saved['command']}` (never edit by hand). The variants: "
        "`BREAKDOWN` in `benchmarks/suite/memory.py`; each runs in a fresh process, and "
        "XLA's buffer assignment is the same in every process.",
        "",
        f"- Date: {saved['date']}",
        f"- keras_als measured: {saved['provenance']}",
        f"- Environment: {saved['environment']}",
        "",
    ]
    for model, used in saved["models"].items():
        rows = [(name, Memory(**m)) for name, m in used]
        lines += [breakdown_table(model, rows), ""]
    return "\n".join(lines).rstrip() + "\n"


def _write_breakdown(models: list[str], used: dict, out: str = BREAKDOWN_RESULTS) -> None:
    from benchmarks.harness import provenance

    models_used = {m: [(name, dataclasses.asdict(x)) for name, x in used[m]] for m in models}
    provenance.save(
        out,
        "python -m benchmarks.suite.memory --breakdown " + " ".join(models),
        {"models": models_used},
        breakdown_markdown,
    )


def xla_total(dump: str, name: str = "train_step") -> int:
    """The largest "Total bytes used" of XLA modules named like `name` in `dump`."""
    return _largest_buffer_assignment(dump, name)[0]


def xla_peak(dump: str, name: str = "train_step") -> int:
    """XLA's "peak usage" (bytes live at once) of the module `xla_total` reads."""
    text = _largest_buffer_assignment(dump, name)[1]
    found = re.search(r"peak usage: ([\d ]+) bytes", text)
    if not found:
        raise RuntimeError(f"XLA's buffer assignment for {name} states no peak usage")
    return int(found.group(1).replace(" ", ""))


def _largest_buffer_assignment(dump: str, name: str) -> tuple[int, str]:
    """(total bytes, text) of the buffer assignment of `name` with the largest total."""
    found = []
    for path in glob.glob(os.path.join(dump, f"*{name}*buffer-assignment.txt")):
        with open(path) as f:
            text = f.read()
        total = re.search(r"Total bytes used: (\d+)", text)
        if total:
            found.append((int(total.group(1)), text))
    if not found:
        raise RuntimeError(f"XLA wrote no buffer assignment for {name}")
    return max(found, key=lambda pair: pair[0])


def high_water_mb() -> float:
    """This process's peak resident set (VmHWM), MiB.

    Not `resource.getrusage().ru_maxrss`: Linux keeps that across `exec`, so a
    child started from a large parent reports the parent's peak.
    """
    with open("/proc/self/status") as f:
        found = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    return int(found.group(1)) / 1024.0 if found else float("nan")


def _instrumented_keras_lso():
    from benchmarks.harness import scaling

    return scaling.Method(
        "keras_lso_instrumented",
        "keras_lso",
        wrap=True,
        label="Keras's LossScaleOptimizer on the instrumented model (instrumentation only)",
    )


def _probe(model_name: str, method_name: str, steps: int) -> dict:
    import tensorflow as tf

    from benchmarks.harness import isolation, scaling, xla_step
    from benchmarks.suite import cost

    builder, x, y = cost.model_named(model_name)
    known = (*scaling.ALL_METHODS, *cost.BREAKDOWN, _instrumented_keras_lso())
    method = {m.name: m for m in known}[method_name]
    isolation.set_seed(0)
    model, optimizer = method.build(builder)
    step = xla_step.compiled_step(model, optimizer, cost.loss_for(y, model))
    x, y = tf.constant(x), tf.constant(y)
    before = high_water_mb()
    for _ in range(steps):
        step(x, y).numpy()
    peak = high_water_mb()
    return {
        "model": model_name,
        "method": method_name,
        "xla_bytes": xla_total(os.environ["XLA_DUMP_DIR"]),
        "xla_peak_bytes": xla_peak(os.environ["XLA_DUMP_DIR"]),
        "peak_rss_mb": peak,
        "rss_growth_mb": peak - before,
    }


def main(argv: list[str] | None = None) -> None:
    """The command; see `python -m benchmarks.suite.memory --help`."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.suite.memory",
        description="XLA step memory of keras_als against Keras's LSO. With no argument: "
        "every model of MODELS under both, each in a fresh subprocess, then the memory "
        "table and target 5. With MODEL METHOD: that one configuration (the subprocess), "
        "one JSON line.",
    )
    parser.add_argument(
        "arguments",
        nargs="*",
        metavar="MODEL [METHOD [STEPS [ABLATION]]]",
        help="the models of --breakdown; or one configuration: a model, a method, the "
        "steps to run (20) and an ablation of harness/ablations.py",
    )
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="each model's table of BREAKDOWN's variants (every model of MODELS if none is "
        "named), written to --out too",
    )
    parser.add_argument(
        "--out",
        help="--breakdown writes OUT.md and OUT.json (default: the committed run, "
        f"{BREAKDOWN_RESULTS})",
    )
    args = parser.parse_args(argv)
    if args.out is not None and not args.breakdown:
        parser.error("--out goes with --breakdown")
    if args.breakdown:
        models, used, out = args.arguments or list(MODELS), {}, args.out or BREAKDOWN_RESULTS
        for model in models:
            used[model] = breakdown(model)
            print(breakdown_table(model, used[model]), end="\n\n", flush=True)
        _write_breakdown(models, used, out)
        print(f"wrote {out}.md", flush=True)
        return
    if not args.arguments:
        from benchmarks.suite import tables, targets

        used = [measure(m, method) for m in MODELS for method in (targets.BASELINE, targets.OURS)]
        print(tables.memory_table(used))
        print(targets.target_memory(used).line())
        return
    if not 2 <= len(args.arguments) <= 4:
        parser.error("one configuration is MODEL METHOD [STEPS [ABLATION]]")
    model, method, steps, ablation = [*args.arguments, "20", ""][:4]
    with tempfile.TemporaryDirectory(prefix="keras_als_xla_") as dump:
        os.environ["XLA_DUMP_DIR"] = dump
        os.environ["XLA_FLAGS"] = (
            f"--xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*train_step.*"
        )
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        with ablations.named(ablation):
            print(json.dumps(_probe(model, method, int(steps))), flush=True)


if __name__ == "__main__":
    main()
