"""What TensorFlow's lowering to XLA costs per operation, by kind of operation.

A compiled first step's `bridge` part (`benchmarks.profiles first_step`) is
TensorFlow lowering the step's graph to XLA's program. keras_als's step adds
a few operations per weight gradient, to read its largest magnitude; this
profile says what each kind costs the bridge.

`python -m benchmarks.profiles bridge_ops [--chains N] [--rounds R]` builds,
for each chain of `CHAINS`, a `jit_compile=True` function of N such chains
(each on its own product `x * (k + 1)`, so that none is shared), and times
TensorFlow's lowering of it (`experimental_get_compiler_ir(...)(stage="hlo")`
on a fresh function, so that nothing is cached). It prints the median over
R rounds (the chains in a shuffled order each round) and the milliseconds
per chain beyond the `none` chain, which reads one element and reduces
nothing.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

INF = float("inf")
CHAINS = {
    "none": lambda g: g[0, 0, 0],
    "reduce_max(g)": tf.reduce_max,
    "reduce_max(maximum(g, -g))": lambda g: tf.reduce_max(tf.maximum(g, -g)),
    "reduce_max(abs(g))": lambda g: tf.reduce_max(tf.abs(g)),
    "reduce_any(not_equal(g, g))": lambda g: tf.reduce_any(tf.not_equal(g, g)),
    "reduce_any(is_nan(g))": lambda g: tf.reduce_any(tf.math.is_nan(g)),
}
"""Each chain, by the operations it lowers, applied to one float16 tensor."""

SHAPE = (4, 65, 768)
"""A ViT-Base token activation at batch 4: one tensor for every chain."""


def lowering_seconds(chain, chains: int) -> float:
    """Seconds TensorFlow takes to lower a new function of `chains` of `chain` to XLA."""

    @tf.function(jit_compile=True, autograph=False)
    def function(x):
        return [tf.cast(chain(x * float(k + 1)), tf.float32) for k in range(chains)]

    x = tf.ones(SHAPE, tf.float16)
    function.get_concrete_function(x)  # trace first: only the lowering is timed
    start = time.perf_counter()
    function.experimental_get_compiler_ir(x)(stage="hlo")
    return time.perf_counter() - start


def medians(chains: int = 100, rounds: int = 3, seed: int = 0) -> dict[str, float]:
    """Median lowering seconds of each chain of `CHAINS`, interleaved in a
    shuffled order every round, after one untimed round."""
    order = random.Random(seed)
    for name in CHAINS:
        lowering_seconds(CHAINS[name], 2)
    times = {name: [] for name in CHAINS}
    for _ in range(rounds):
        for name in order.sample(list(CHAINS), len(CHAINS)):
            times[name].append(lowering_seconds(CHAINS[name], chains))
    return {name: statistics.median(t) for name, t in times.items()}


def table(median: dict[str, float], chains: int) -> str:
    """The Markdown table of `median` (seconds per function of `chains` chains)."""
    rows = [
        f"| chain | lowering {chains} chains (s) | ms per chain beyond `none` |",
        "| --- | --- | --- |",
    ]
    for name, seconds in median.items():
        beyond = (seconds - median["none"]) / chains * 1e3
        rows.append(f"| `{name}` | {seconds:.3f} | {beyond:.2f} |")
    return "\n".join(rows)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chains", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    print(table(medians(args.chains, args.rounds), args.chains))


if __name__ == "__main__":
    main()
