"""Why Keras's first step, not keras_als's, is the slow one on the deepest nets.

The cost study (`benchmarks.cost_at_size`) measured keras_als's first step at
well under Keras's on its deepest models (DenseNet201, and ResNet152 in an
earlier run). The cause is in Keras's program. `LossScaleOptimizer` applies
the updates under a conditional on whether every gradient is finite; XLA
turns that conditional into selects, and the predicate (an AND of one
finiteness reduction per gradient: cheap, elementwise on scalars) is fused
into every update kernel, copied. So each of the N update kernels reads about
N operands, and the compile grows as N squared. keras_als's predicate comes
out of a reduction over all components at once, one buffer that every update
reads: its update kernels keep a handful of operands each.

For plain stacks of N `Dense` layers (mixed_float16, SGD, batch 4, a custom
step with `jit_compile=True`), this prints, for Keras's optimizer and for
keras_als: the first step (trace, compile, run; one process, Keras first),
and in the optimized program the largest number of operands of one fusion
and the operands of all fusions together.

    python -m benchmarks.profiles update_fusions [--depths 16 32 64 128]
"""

from __future__ import annotations

import argparse
import os
import re
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from benchmarks.harness import scaling  # noqa: E402
from benchmarks.harness.xla_step import compiled_step  # noqa: E402

DEPTHS = (16, 32, 64, 128)
WIDTH = 32


def fusion_operands(program: str) -> list[int]:
    """The number of operands of every fusion instruction of an optimized HLO text."""
    counts = []
    for line in program.splitlines():
        match = re.search(r"= \S+ fusion\((.*?)\), kind=", line)
        if match:
            counts.append(len(re.findall(r"%[\w.\-]+", match.group(1))))
    return counts


def first_step(depth: int, method: str) -> dict:
    """One first step of a stack of `depth` Dense layers under `method`."""
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    layers = [keras.layers.Dense(WIDTH, activation="relu") for _ in range(depth)]
    model = keras.Sequential([keras.Input((WIDTH,)), *layers, keras.layers.Dense(10)])
    adaptive = method == "keras_als"
    inner = keras.optimizers.SGD(0.01)
    model, optimizer = scaling.loss_scaled(model, inner, wrap=adaptive, adaptive=adaptive)
    optimizer.build(model.trainable_variables)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = compiled_step(model, optimizer, loss)
    x = tf.random.stateless_normal([4, WIDTH], seed=[0, depth])
    y = tf.zeros([4], "int32")
    start = time.perf_counter()
    step(x, y)
    seconds = time.perf_counter() - start
    operands = fusion_operands(step.experimental_get_compiler_ir(x, y)(stage="optimized_hlo"))
    return {"seconds": seconds, "largest": max(operands), "total": sum(operands)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    args = parser.parse_args(argv)
    first_step(4, "keras")  # untimed: the first compile of a process starts XLA
    print(
        "| Dense layers | variables | first step (s): Keras / keras_als | ratio "
        "| largest fusion's operands: Keras / keras_als "
        "| all fusions' operands: Keras / keras_als |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for depth in args.depths:
        found = {m: first_step(depth, m) for m in ("keras", "keras_als")}
        k, a = found["keras"], found["keras_als"]
        print(
            f"| {depth} | {2 * depth + 2} | {k['seconds']:.1f} / {a['seconds']:.1f} "
            f"| {a['seconds'] / k['seconds']:.2f} | {k['largest']} / {a['largest']} "
            f"| {k['total']} / {a['total']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
