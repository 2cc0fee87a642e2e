"""Step time of keras_als over Keras's `LossScaleOptimizer`, measured interleaved.

Both methods train the same model (same weights, same batch) with the same
custom step, compiled with `jit_compile=True` (XLA). After warm-up the two
compiled steps run in alternating blocks, ABBA order (A, B, B, A, A, B, ...),
in one process, so that load from other processes on the machine hits both
alike; the ratio is the median over block pairs of `time(keras_als) /
time(Keras LSO)`. The same measurement on MLPs with 10, 50 and 200 wrapped
layers shows how the overhead grows with the number of layers.

    python -m benchmarks.cost --models transformer,residual_cnn --sweep 200 --blocks 16

times chosen models (with the breakdown variants) and sweep sizes on their own.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from benchmarks import common, zoo


@dataclasses.dataclass
class Timing:
    """Interleaved step times of keras_als (max_safe) and Keras LSO on one model.

    Attributes:
        model: Model name.
        method: The keras_als variant timed (default: `"als_max_safe"`).
        layers: Number of wrapped layers (scale boundaries).
        als_ms: Median step time of keras_als, milliseconds.
        lso_ms: Median step time of Keras LSO, milliseconds.
        ratio: Median over block pairs of the time ratio keras_als / Keras LSO.
        blocks: Number of block pairs.
        steps_per_block: Steps in each timed block.
    """

    model: str
    method: str
    layers: int
    als_ms: float
    lso_ms: float
    ratio: float
    blocks: int
    steps_per_block: int

    @property
    def overhead_ms(self) -> float:
        """Extra time per step of keras_als, milliseconds (may be negative: noise)."""
        return self.als_ms - self.lso_ms


def deep_mlp(depth: int, width: int = 64, features: int = 32) -> Callable[[], keras.Model]:
    """A builder of `depth` Dense(width, tanh) layers plus a Dense(1) head."""

    def build() -> keras.Model:
        return keras.Sequential(
            [keras.Input((features,))]
            + [keras.layers.Dense(width, activation="tanh") for _ in range(depth)]
            + [keras.layers.Dense(1)]
        )

    return build


def timing_models() -> list[tuple[str, Callable[[], keras.Model], np.ndarray, np.ndarray]]:
    """`(name, builder, x, y)` for the step-time table (the layer sweep is separate)."""
    rng = np.random.default_rng(0)
    x_digits, y_digits, _, _ = common.digits_data()
    tokens = rng.integers(0, 64, size=(64, 16)).astype("int32")
    return [
        ("cnn_batchnorm", zoo.digits_cnn, x_digits[:64], y_digits[:64].astype("float32")),
        ("residual_cnn", zoo.residual_cnn, x_digits[:64], y_digits[:64].astype("float32")),
        ("transformer", zoo.transformer_encoder, tokens, rng.integers(0, 4, 64).astype("float32")),
        (
            "deep_mlp",
            lambda: zoo.mlp(8, 64, 32, 8, "relu"),
            rng.normal(size=(64, 32)).astype("float32"),
            rng.integers(0, 8, 64).astype("float32"),
        ),
    ]


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
    common.Method(
        "als_every_step",
        "als",
        common.policies.MaxSafe(),
        wrap=True,
        measure_every_n_steps=1,
        label="keras_als, MaxSafe, measuring every step (measure_every_n_steps=1)",
    ),
    common.Method(
        "als_fixed_wrapped",
        "als",
        common.policies.Fixed(default=2.0**10),
        wrap=True,
        initial_scale=2.0**10,
        label="keras_als wrapped, Fixed policy: same boundaries and statistics, no policy math",
    ),
    common.Method(
        "als_fixed_global",
        "als",
        common.policies.Fixed(default=2.0**10),
        wrap=False,
        initial_scale=2.0**10,
        label="keras_als unwrapped, Fixed policy: one global scale",
    ),
)
"""Extra variants that split keras_als's overhead into its parts."""


def interleaved(
    name: str,
    builder: Callable[[], keras.Model],
    x: np.ndarray,
    y: np.ndarray,
    blocks: int,
    steps_per_block: int,
    extra: tuple[common.Method, ...] = (),
) -> list[Timing]:
    """Times keras_als (max_safe, and `extra` variants) against Keras LSO, interleaved.

    Args:
        name: Model name for the table.
        builder: Returns a fresh built model under the current policy.
        x: One batch of inputs.
        y: One batch of targets.
        blocks: Rounds; each round times one block of every method, the order
            reversed every other round.
        steps_per_block: Steps per block.
        extra: More keras_als variants timed in the same rounds.

    Returns:
        One `Timing` per keras_als variant, each against Keras LSO.
    """
    common.set_seed(0)
    with common.precision("float32"):
        weights = builder().get_weights()
    methods = (common.KERAS_LSO, common.ALS_MAX_SAFE, *extra)
    steps = {}
    wrapped = 0
    for method in methods:
        model, optimizer = method.build(builder, weights, keras.optimizers.Adam(1e-4))
        if method.wrap:
            wrapped = sum(1 for layer in model.layers if layer.name.endswith("_scaled"))
        steps[method.name] = common.compiled_step(model, optimizer, loss_for(y, model))
    x, y = tf.constant(x), tf.constant(y)
    for step in steps.values():
        _time_block(step, x, y, 3)  # trace, compile, settle
    times: dict[str, list[float]] = {m.name: [] for m in methods}
    ratios: dict[str, list[float]] = {m.name: [] for m in methods}
    for i in range(blocks):
        order = methods if i % 2 == 0 else methods[::-1]
        measured = {m.name: _time_block(steps[m.name], x, y, steps_per_block) for m in order}
        for m in methods:
            times[m.name].append(measured[m.name])
            ratios[m.name].append(measured[m.name] / measured["keras_lso"])
    lso_ms = 1e3 * float(np.median(times["keras_lso"]))
    return [
        Timing(
            name,
            m.name,
            wrapped,
            1e3 * float(np.median(times[m.name])),
            lso_ms,
            float(np.median(ratios[m.name])),
            blocks,
            steps_per_block,
        )
        for m in methods[1:]
    ]


def layer_sweep(
    depths: tuple[int, ...], blocks: int, steps_per_block: int, log: Callable[[str], None] = print
) -> list[Timing]:
    """Interleaved timing on MLPs whose wrapped layer count is each of `depths`."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 32)).astype("float32")
    y = rng.normal(size=(64, 1)).astype("float32")
    results = []
    for depth in depths:
        (timing,) = interleaved(f"mlp_{depth}", deep_mlp(depth - 1), x, y, blocks, steps_per_block)
        log(_line(timing))
        results.append(timing)
    return results


def growth_exponent(timings: list[Timing]) -> float:
    """Exponent k of overhead ~ layers**k between the two largest sweeps.

    Returns NaN when an overhead is not positive (lost in the noise).
    """
    (a, b) = sorted(timings, key=lambda t: t.layers)[-2:]
    if a.overhead_ms <= 0 or b.overhead_ms <= 0:
        return float("nan")
    return math.log(b.overhead_ms / a.overhead_ms) / math.log(b.layers / a.layers)


def _line(t: Timing) -> str:
    return (
        f"  {t.model:14s} {t.method:18s} {t.layers:4d} wrapped layers: {t.als_ms:.2f} ms, "
        f"Keras LSO {t.lso_ms:.2f} ms, ratio {t.ratio:.3f}"
    )


def run_all(
    blocks: int,
    steps_per_block: int,
    breakdown: bool = True,
    models: tuple[str, ...] | None = None,
    log: Callable[[str], None] = print,
) -> list[Timing]:
    """The step-time table on the timing models (all, or those named in `models`)."""
    results = []
    for name, builder, x, y in timing_models():
        if models is not None and name not in models:
            continue
        extra = BREAKDOWN if breakdown else ()
        for timing in interleaved(name, builder, x, y, blocks, steps_per_block, extra):
            log(_line(timing))
            results.append(timing)
    return results


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
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20, help="steps per block")
    args = parser.parse_args(argv)
    models = tuple(m for m in args.models.split(",") if m)
    if models:
        run_all(args.blocks, args.steps, breakdown=True, models=models)
    depths = tuple(int(d) for d in args.sweep.split(",") if d)
    if depths:
        layer_sweep(depths, args.blocks, args.steps)


if __name__ == "__main__":
    main()
