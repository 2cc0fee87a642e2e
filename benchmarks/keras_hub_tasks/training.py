"""Methods trained side by side in one process: the same batches, in blocks, interleaved.

Every method of a seed starts from the same float32 weights, compiles its own
`model.fit` step with XLA, and trains on the same blocks of batches; the
methods take turns block by block (in an order rotated every block), so a
change in the machine's load falls on all of them alike. Each block's wall
time is recorded: the first holds the compilation, the others give the step
time.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
import time
import traceback
from collections.abc import Callable

import keras
import numpy as np

import keras_als
from benchmarks.harness import scaling

METHODS = (scaling.FLOAT32, scaling.NO_SCALING, scaling.KERAS_LSO, scaling.ALS_MAX_SAFE)
"""The methods every study here compares: float32, mixed_float16 without loss
scaling, Keras's `LossScaleOptimizer`, keras_als (its default policy)."""


@dataclasses.dataclass
class Arm:
    """One method's model and optimizer, and what its blocks recorded."""

    method: scaling.Method
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    block_seconds: list[float] = dataclasses.field(default_factory=list)
    block_losses: list[float] = dataclasses.field(default_factory=list)
    callbacks: list = dataclasses.field(default_factory=list)  # passed to every `fit`

    def skipped(self, steps: int) -> int:
        """Steps not applied: keras_als's `skipped_steps`; for Keras's optimizer,
        steps run minus its `iterations` (0 for the methods that never skip)."""
        return scaling.skipped(self.optimizer, steps)

    def finite_weights(self) -> bool:
        return finite(self.model.get_weights())

    def compiled_block_seconds(self) -> float:
        """Mean wall time of the blocks after the first (compiled ones)."""
        return statistics.fmean(self.block_seconds[1:]) if len(self.block_seconds) > 1 else math.nan

    def compile_seconds(self) -> float:
        """The first block's wall time beyond that of a compiled block: tracing and compiling."""
        return self.block_seconds[0] - self.compiled_block_seconds()


def finite(weights: list[np.ndarray]) -> bool:
    """Whether every value of every weight is finite."""
    return all(np.isfinite(w).all() for w in weights)


def arm(
    method: scaling.Method,
    build: Callable[[], keras.Model],
    weights: list[np.ndarray],
    inner: keras.optimizers.Optimizer,
    jit_compile: bool = True,
    seed: int | None = None,
    **compile_arguments,
) -> Arm:
    """`method`'s model (built under its precision, given `weights`, instrumented
    in place for keras_als) compiled around `inner`, with XLA unless
    `jit_compile` is False.

    With `seed`, the model is built after `keras.utils.set_random_seed(seed)`,
    so that every arm given the same seed draws the same random numbers in
    training (a Dropout layer's seed generator starts from the global seed
    when it is built; `weights` do not hold its state).

    The mixed_float16 row without loss scaling compiles with
    `auto_scale_loss=False`: otherwise `compile` would wrap its optimizer in
    Keras's `LossScaleOptimizer`.
    """
    with scaling.precision("mixed_float16" if method.mixed else "float32"):
        if seed is not None:
            keras.utils.set_random_seed(seed)
        model = build()
        model.set_weights(weights)
        if method.wrap:
            keras_als.wrap_model(model)
        optimizer = method.optimizer(inner)
        model.compile(
            optimizer=optimizer,
            jit_compile=jit_compile,
            auto_scale_loss=method.kind != "none",
            **compile_arguments,
        )
    return Arm(method, model, optimizer)


def error_text(exception: BaseException) -> str:
    """The exception's type and message, on one line, cut to 300 characters."""
    text = f"{type(exception).__name__}: {exception}".replace("\n", " ")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)[:300]  # no terminal colours


def train(
    arms: list[Arm],
    block: Callable[[int], tuple],
    blocks: int,
    batch: int,
    errors: dict[str, str] | None = None,
) -> None:
    """Trains every arm on `blocks` blocks (`block(b)` gives block b's `(x, y)`,
    `batch` examples a step), the arms taking turns within each block.

    With `errors`, an arm whose `fit` raises is recorded there (its method's
    name: the block and `error_text`) and trains no further, and an arm
    already named there does not train; without it, the exception propagates."""
    for b in range(blocks):
        x, y = block(b)
        turn = b % len(arms)
        for one in arms[turn:] + arms[:turn]:
            if errors is not None and one.method.name in errors:
                continue
            start = time.perf_counter()
            try:
                history = one.model.fit(
                    x,
                    y,
                    batch_size=batch,
                    epochs=1,
                    shuffle=False,
                    verbose=0,
                    callbacks=one.callbacks,
                )
            except Exception as exception:  # noqa: BLE001 - recorded where `errors` is given
                if errors is None:
                    raise
                errors[one.method.name] = f"train block {b + 1}: " + error_text(exception)
                traceback.print_exc()
                continue
            one.block_seconds.append(time.perf_counter() - start)
            one.block_losses.append(float(history.history["loss"][-1]))
        print(
            f"  block {b + 1}/{blocks}: "
            + ", ".join(
                f"{a.method.name} {a.block_seconds[-1]:.1f} s"
                for a in arms
                if len(a.block_seconds) == b + 1
            ),
            flush=True,
        )


@dataclasses.dataclass
class Run:
    """One method's run on one seed.

    Attributes:
        method: Method name.
        seed: Seed of the initial weights and the batch order.
        outcome: The study's held-out outcome (NaN where the weights are not finite).
        final_loss: Mean training loss of the last block.
        steps: Steps run.
        skipped: Steps not applied (`Arm.skipped`).
        finite_weights: Whether every weight is finite at the end.
        step_seconds: Mean wall time of a compiled step.
        compile_seconds: The first block's extra wall time (`Arm.compile_seconds`).
        block_seconds: Every block's wall time.
        losses: Every block's mean training loss.
        scales: How many scales the optimizer keeps (keras_als: one per
            instrumented boundary and the loss; Keras LSO: 1; else 0).
    """

    method: str
    seed: int
    outcome: float
    final_loss: float
    steps: int
    skipped: int
    finite_weights: bool
    step_seconds: float
    compile_seconds: float
    block_seconds: list[float]
    losses: list[float]
    scales: int


def record(one: Arm, seed: int, outcome: float, steps_per_block: int) -> Run:
    """The `Run` of a trained arm."""
    steps = steps_per_block * len(one.block_seconds)
    if isinstance(one.optimizer, keras_als.AdaptiveLossScaleOptimizer):
        scales = len(one.optimizer.layer_scales())
    else:
        scales = int(isinstance(one.optimizer, keras.optimizers.LossScaleOptimizer))
    return Run(
        method=one.method.name,
        seed=seed,
        outcome=outcome,
        final_loss=one.block_losses[-1],
        steps=steps,
        skipped=one.skipped(steps),
        finite_weights=one.finite_weights(),
        step_seconds=one.compiled_block_seconds() / steps_per_block,
        compile_seconds=one.compile_seconds(),
        block_seconds=one.block_seconds,
        losses=one.block_losses,
        scales=scales,
    )
