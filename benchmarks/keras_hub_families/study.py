"""One family's run: every method on the same weights and batches, seed by seed."""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

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


class Setting(NamedTuple):
    """One family's seed, ready to train: the float32 model its weights come
    from, the training examples in its inputs' form, the batch order (`BATCH`
    rows a step) and the arguments of `compile`."""

    family: families.Family
    reference: keras.Model
    weights: list
    x: object
    y: np.ndarray
    order: np.ndarray
    compile_arguments: dict


def setting(name: str, seed: int, steps: int) -> Setting:
    """Family `name` on `seed` for `steps` steps (raises what its float32 build raises)."""
    family = families.FAMILIES[name]
    keras.utils.clear_session()
    keras.utils.set_random_seed(seed)
    x, y = batches.data(family.kind, "train")
    with scaling.precision("float32"):
        reference = family.build()
        weights = reference.get_weights()
    order = np.random.default_rng(seed).permutation(len(y))[: steps * BATCH]
    compile_arguments = {"loss": family.loss} if family.loss is not None else {}
    return Setting(
        family, reference, weights, batches.inputs_for(reference, x), y, order, compile_arguments
    )


def arm(method: scaling.Method, given: Setting, seed: int) -> training.Arm:
    """`method`'s model from `given`'s weights, compiled around Adam, without XLA."""
    return training.arm(
        method,
        given.family.build,
        given.weights,
        keras.optimizers.Adam(LEARNING_RATE),
        False,
        seed,
        **given.compile_arguments,
    )


def run_seed(
    name: str, seed: int, blocks: int = BLOCKS, steps_per_block: int = STEPS_PER_BLOCK
) -> list[dict]:
    """Every method on family `name` and `seed`: one result dict a method.

    A method whose build or training raises is recorded with its `error`
    (and NaN losses); so is every method when the float32 build raises."""
    try:
        given = setting(name, seed, blocks * steps_per_block)
        test_x, test_y = batches.data(given.family.kind, "test")
        test_x = batches.inputs_for(given.reference, test_x)
    except Exception as exception:  # noqa: BLE001 - a family that fails to build is listed
        return [_failed(name, m, seed, "build: " + training.error_text(exception)) for m in METHODS]
    x, y, order = given.x, given.y, given.order
    size = steps_per_block * BATCH
    arms, errors = [], {}
    for method in METHODS:
        try:
            one = arm(method, given, seed)
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
