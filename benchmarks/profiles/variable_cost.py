"""What each variable a compiled step updates costs it, on this CPU.

`python -m benchmarks.profiles variable_cost [--rounds N]` compiles one small step
(a 64x64 matrix product added to a variable, `jit_compile=True`) that also
assigns 0, 4 or 16 small extra variables, and times calls of all three,
interleaved in one process. It prints each one's median time per call and
the cost per extra variable. Why keras_als keeps its optimizer state in few
variables (`keras_als/step/_scale_state.py`): a variable costs the step a fixed
time, whatever its size, which on a model whose step takes a few
milliseconds is a measurable share.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

EXTRA = (0, 4, 16)
"""Extra variables assigned per step, one compiled step each."""


def step_with(extra: int):
    """A jit-compiled step that updates one 64x64 variable and `extra` 8-vectors."""
    weights = tf.Variable(tf.zeros([64, 64]))
    state = [tf.Variable(tf.zeros([8])) for _ in range(extra)]

    @tf.function(jit_compile=True)
    def step(x):
        weights.assign_add(tf.matmul(x, x) * 1e-9)
        for variable in state:
            variable.assign(variable + 1.0)

    return step


def medians(rounds: int = 2000, seed: int = 0) -> dict[int, float]:
    """Median seconds per call of each step of `EXTRA`, calls interleaved in a
    shuffled order every round."""
    x = tf.ones([64, 64])
    steps = {extra: step_with(extra) for extra in EXTRA}
    for step in steps.values():
        for _ in range(5):  # trace, compile, warm up
            step(x)
    order = random.Random(seed)
    times = {extra: [] for extra in EXTRA}
    for _ in range(rounds):
        for extra in order.sample(list(EXTRA), len(EXTRA)):
            start = time.perf_counter()
            steps[extra](x)
            times[extra].append(time.perf_counter() - start)
    return {extra: statistics.median(t) for extra, t in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args(argv)
    median = medians(args.rounds)
    print("| extra variables | median us per call | us per extra variable |")
    print("| --- | --- | --- |")
    for extra, seconds in median.items():
        each = (seconds - median[0]) / extra * 1e6 if extra else float("nan")
        print(f"| {extra} | {seconds * 1e6:.1f} | {each:.1f} |")


if __name__ == "__main__":
    main()
