"""The plan, fixed before any number: the methods, seeds and steps."""

from __future__ import annotations

from benchmarks.harness import scaling

STEPS = 1000
"""Adam steps per run, times the case's `train_steps`."""
SEEDS = (0, 1, 2, 3, 4)
METHODS: tuple[scaling.Method, ...] = (
    scaling.FLOAT32,
    scaling.NO_SCALING,
    scaling.KERAS_LSO,
    scaling.ALS_MAX_SAFE,
)
