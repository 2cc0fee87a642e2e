"""What XLA's peak step memory counts, buffer by buffer.

The cost study (`benchmarks.cost_at_size`) reads each compiled training
step's peak memory from XLA's buffer assignment ("peak usage": the bytes
live at once in XLA's heap simulation). On three models it differs from
Keras's by far more than keras_als's own buffers: 1.67x on MobileNetV3Small
and MobileNetV3Large, 0.59x on EfficientNetB0. This compiles a model's step
as the study does (`fit`'s train function, mixed_float16, SGD, XLA), once
under each method in a process of its own with the buffer assignment dumped,
and prints per method XLA's peak, its total allocation ("Total bytes used")
and the largest buffers live at the peak, each with its live range (in the
program's schedule) and the instruction that makes it.

    python -m benchmarks.profiles peak_buffers --models mobilenet_v3_small efficientnet_b0
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

from benchmarks.harness import xla_memory

METHODS = ("keras", "keras_als")
SHOWN = 3
"""Buffers printed per method: the largest live at the peak."""


def peak_buffers(text: str) -> list[tuple[str, int, str]]:
    """[(buffer, bytes, live range)] live at XLA's peak, largest first, of one
    buffer-assignment text."""
    at_peak = text.split("(peak):", 1)[1].split("\n\n", 1)[0]
    ranges = dict(re.findall(r"^\s+(\S+)\{\}:(\d+-\d+)$", text, flags=re.M))
    buffers = [
        (name, int(size), ranges.get(name, "?"))
        for name, size in re.findall(r"^\s+(\S+)\{\}: (\d+) bytes", at_peak, flags=re.M)
    ]
    return sorted(buffers, key=lambda b: -b[1])


def instruction(program: str, name: str) -> str:
    """The optimized HLO line that defines `name`, shortened to its shape and op."""
    found = re.search(rf"^\s*(?:ROOT )?%{re.escape(name)} = (\S+) (\w[\w-]*)\(", program, re.M)
    return f"{found.group(2)} {found.group(1)}" if found else "?"


def _compile_one(name: str, method: str) -> None:
    """Compiles and runs one step of model `name` under `method` (XLA_FLAGS set by the caller)."""
    from benchmarks.cost_at_size import measure, plan

    x, y = plan.data(name)
    model, _ = measure.build(name, method)
    measure.step(model, x, y)


def _program(assignment: str) -> str:
    """The optimized program dumped beside the buffer assignment at `assignment`."""
    with open(assignment.replace("-buffer-assignment.txt", ".txt")) as f:
        return f.read()


def report(name: str) -> None:
    """Prints `name`'s peak, total and largest buffers at the peak, per method."""
    print(f"## {name}\n")
    print("| method | XLA's peak (MB) | total allocation (MB) | largest buffers at the peak |")
    print("| --- | --- | --- | --- |")
    for method in METHODS:
        with tempfile.TemporaryDirectory() as dump:
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
            env["XLA_FLAGS"] = xla_memory.dump_flags(dump, "one_step_on_data")
            module = "benchmarks.profiles.peak_buffers"
            command = [sys.executable, "-m", module, "--compile", name, method]
            subprocess.run(command, env=env, check=True)
            paths = xla_memory.buffer_assignments(dump, "one_step_on_data")
            total, text, path = xla_memory.largest_buffer_assignment(paths, "one_step_on_data")
            peak, buffers = xla_memory.peak_in(text), peak_buffers(text)
            program = _program(path)
        shown = "; ".join(
            f"`{b}` {size / 1e6:.1f} MB, live {live} ({instruction(program, b)})"
            for b, size, live in buffers[:SHOWN]
        )
        print(f"| {method} | {peak / 1e6:.1f} | {total / 1e6:.1f} | {shown} |", flush=True)
    print()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["mobilenet_v3_small"])
    parser.add_argument("--compile", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile:
        _compile_one(*args.compile)
        return
    for name in args.models:
        report(name)


if __name__ == "__main__":
    main()
