"""One family's run: every method on the same weights and batches, seed by seed."""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np

import keras_als
from benchmarks.flat_regions import plan as flat_regions
from benchmarks.harness import scaling
from benchmarks.keras_hub_families import batches, families
from benchmarks.keras_hub_tasks import training

FALLBACK = flat_regions.FALLBACK
METHODS = (*training.METHODS, FALLBACK)
"""float32, mixed_float16 without scaling, Keras's LSO, keras_als, keras_als + Float32Fallback."""
SEEDS = (1, 2)
BATCH = 4
BLOCKS = 4
STEPS_PER_BLOCK = 10
LEARNING_RATE = 1e-3
DIAGNOSED_EXAMPLES = 16


def _rows(x, rows):
    if isinstance(x, dict):
        return {k: v[rows] for k, v in x.items()}
    return x[rows]


def held_out_loss(model: keras.Model, x, y) -> float:
    """The compiled loss on the held-out examples (NaN where not finite)."""
    value = float(model.evaluate(x, y, batch_size=8, verbose=0, return_dict=True)["loss"])
    return value if math.isfinite(value) else math.nan


def run_seed(
    name: str, seed: int, blocks: int = BLOCKS, steps_per_block: int = STEPS_PER_BLOCK
) -> list[dict]:
    """Every method on family `name` and `seed`: one result dict a method.

    A method whose build or training raises is recorded with its `error`
    (and NaN losses); so is every method when the float32 build raises."""
    family = families.FAMILIES[name]
    keras.utils.clear_session()
    keras.utils.set_random_seed(seed)
    x, y = batches.data(family.kind, "train")
    test_x, test_y = batches.data(family.kind, "test")
    compile_arguments = {"loss": family.loss} if family.loss is not None else {}
    try:
        with scaling.precision("float32"):
            reference = family.build()
            weights = reference.get_weights()
        x, test_x = batches.inputs_for(reference, x), batches.inputs_for(reference, test_x)
    except Exception as exception:  # noqa: BLE001 - a family that fails to build is listed
        return [_failed(name, m, seed, "build: " + training.error_text(exception)) for m in METHODS]
    order = np.random.default_rng(seed).permutation(len(y))[: blocks * steps_per_block * BATCH]
    size = steps_per_block * BATCH
    arms, errors = [], {}
    for method in METHODS:
        try:
            one = training.arm(
                method,
                family.build,
                weights,
                keras.optimizers.Adam(LEARNING_RATE),
                False,
                seed,
                **compile_arguments,
            )
        except Exception as exception:  # noqa: BLE001
            errors[method.name] = "build: " + training.error_text(exception)
            continue
        if method is FALLBACK:
            first = order[:DIAGNOSED_EXAMPLES]
            one.callbacks.append(
                keras_als.Float32Fallback(_rows(x, first), y[first], verbose=False)
            )
        arms.append(one)
    if arms:

        def block(b):
            rows = order[b * size : (b + 1) * size]
            return _rows(x, rows), y[rows]

        training.train(arms, block, blocks, BATCH, errors)
    results = []
    for method in METHODS:
        one = next((a for a in arms if a.method is method), None)
        if one is None or method.name in errors:
            results.append(_failed(name, method, seed, errors[method.name]))
            continue
        try:
            outcome = held_out_loss(one.model, test_x, test_y)
        except Exception as exception:  # noqa: BLE001
            outcome = math.nan
            errors[method.name] = "evaluate: " + training.error_text(exception)
        run = training.record(one, seed, outcome, steps_per_block)
        row = dataclasses.asdict(run) | {"family": name, "error": errors.get(method.name)}
        if method is FALLBACK:
            row["fallback_applied"] = one.callbacks[0].applied
        results.append(row)
    return results


def _failed(name: str, method: scaling.Method, seed: int, error: str) -> dict:
    """The row of a method that did not train."""
    return {
        "family": name,
        "method": method.name,
        "seed": seed,
        "outcome": math.nan,
        "final_loss": math.nan,
        "skipped": None,
        "error": error,
    }
