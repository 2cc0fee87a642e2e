"""Skipped steps: which steps of a training run each method skipped."""

from __future__ import annotations

from typing import NamedTuple

import keras_als
from benchmarks.harness.scaling import prebuild, skipped
from benchmarks.real_models.architectures import BATCH, batch, build, data


class SkipRun(NamedTuple):
    """What one skip run recorded (`skip_trace`), one entry per step in `skipped` and `losses`."""

    skipped: list[int]
    """Steps skipped so far, after each step."""
    measured: list[int]
    """The steps on which keras_als's optimizer measured its scales (empty for Keras's)."""
    losses: list[float]
    """Each step's training loss."""


def skip_trace(
    name: str,
    method: str,
    steps: int,
    seed: int = 0,
    batches: int | None = None,
    jit: bool = True,
) -> SkipRun:
    """Trains `name` for `steps` steps with `method` (mixed_float16, XLA unless
    `jit` is False, Adam, batch 8; the same weights and batches for either
    method) and records the skipped steps, the measuring steps (step 0 always
    measures) and the losses.

    The batches are the first `steps` of `data(name, batches)` (`batches`
    defaults to `steps`): a run of 50 steps with `batches=1050` trains on the
    first 50 batches of the 1,050-step run.
    """
    model, optimizer = build(name, method, seed, jit=jit)
    prebuild(model)
    x, y = data(name, max(steps, batches or steps), seed)
    ours = isinstance(optimizer, keras_als.AdaptiveLossScaleOptimizer)
    run = SkipRun([], [], [])
    for i in range(steps):
        # Before its first step the optimizer has no state yet: that step measures.
        if ours and (i == 0 or _measures_next(optimizer)):
            run.measured.append(i)
        loss = model.train_on_batch(batch(x, i), y[i * BATCH : (i + 1) * BATCH])
        run.losses.append(float(loss))
        run.skipped.append(skipped(optimizer, i + 1))
    return run


def _measures_next(optimizer) -> bool:
    """Whether keras_als's next step measures the gradients."""
    return int(optimizer.scaling.counter("steps_until_measuring").numpy()) == 0
