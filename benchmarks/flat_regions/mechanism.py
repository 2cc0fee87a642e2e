"""The mechanism in numbers: per layer, float32's gradient range at the start
and later in training, and the share of gradient values each mixed method loses.

`python -m benchmarks.flat_regions.mechanism [--quick] [--models ...]`
writes `flat_regions_mechanism.json` and `.md` beside the study's results.

The plan (fixed before the first number): each model of the study on seed 1,
the study's weights and batch order, measured on the seed's first batch. At
*start* the weights are the initial ones; *later* they are float32's after
`LATER_SHARE` of the study's steps (Adam 1e-3). Each mixed method (no
scaling, Keras's `LossScaleOptimizer`, keras_als, keras_als with the layers
`diagnose` names in float32) trains itself on the same batches up to that
point (its scales follow their own history), is then given float32's
weights, and runs `SETTLE` steps at learning rate 0 on the measured batch
(its scales settle there, the weights do not move) before its unscaled
gradients are taken on that batch. Gradients are taken in inference mode
(no dropout, whose masks would differ between the models). A value is *lost*
where float32's gradient is not zero and the method's is zero or not finite
(a step with an overflow loses every value: it is skipped).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

import keras_als
from benchmarks.flat_regions import plan
from benchmarks.harness import provenance, scaling
from benchmarks.keras_hub_tasks import training

LATER_SHARE = 0.5
"""Where "later" is: this share of the model's steps in the study."""
SETTLE = 40
"""Steps at learning rate 0 before a measurement (Keras's scale halves from
2**15 to 2**-15 in 30 skipped steps)."""
FLOAT16_MAX = 65504.0
"""float16's largest finite value."""
FLOAT16_SMALLEST = 2.0**-24
"""float16's smallest subnormal: below half of it a value rounds to zero."""
MIXED = plan.METHODS[1:4] + (plan.DIAGNOSED,)
QUICK_STEPS = 4


def gradient_range(gradients: list[np.ndarray]) -> dict:
    """Of one layer's float32 gradients: the largest magnitude, the smallest
    that is not zero, and the shares of values not zero that lie above
    float16's largest or below its smallest subnormal (at scale 1)."""
    values = np.abs(np.concatenate([g.ravel() for g in gradients]).astype(np.float64))
    nonzero = values[values > 0]
    if not nonzero.size:
        return {"largest": 0.0, "smallest": 0.0, "above": 0.0, "below": 0.0}
    return {
        "largest": float(nonzero.max()),
        "smallest": float(nonzero.min()),
        "above": float(np.mean(nonzero > FLOAT16_MAX)),
        "below": float(np.mean(nonzero < FLOAT16_SMALLEST)),
    }


def lost_share(reference: list[np.ndarray], measured: list[np.ndarray]) -> float:
    """The share of values whose float32 gradient is not zero and whose
    measured gradient is zero or not finite."""
    r = np.concatenate([g.ravel() for g in reference])
    m = np.concatenate([g.ravel() for g in measured])
    nonzero = r != 0
    if not nonzero.any():
        return 0.0
    return float(np.mean(np.logical_or(m == 0, ~np.isfinite(m))[nonzero]))


def by_layer(paths: list[str]) -> dict[str, list[int]]:
    """Variable indices grouped by their layer's path (the variable's path
    without its own name), in order of first appearance."""
    layers: dict[str, list[int]] = {}
    for i, path in enumerate(paths):
        layers.setdefault(path.rsplit("/", 1)[0], []).append(i)
    return layers


def true_gradients(model: keras.Model, optimizer, x, y, jit_compile: bool) -> list[np.ndarray]:
    """The method's unscaled gradients of the model's own loss on `(x, y)`."""

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            y_pred = model(x, training=False)
            loss = model.compute_loss(x=x, y=y, y_pred=y_pred)
            scaled = scaling.scale_loss(optimizer, loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        return scaling.true_gradients(optimizer, grads, model.trainable_variables)

    return [np.asarray(tf.convert_to_tensor(g), np.float32) for g in step(x, y)]


def measure(name: str, later_steps: int | None = None) -> dict:
    """Both phases of model `name` on seed 1: per layer the float32 range and
    each mixed method's lost share, and each method's scales and skips."""
    spec = plan.MODELS[name]
    later_steps = later_steps or int(LATER_SHARE * spec.blocks * spec.steps_per_block)
    keras.utils.clear_session()
    keras.utils.set_random_seed(1)
    with scaling.precision("float32"):
        initial = spec.build().get_weights()
    x, y = spec.data("train")
    order = np.random.default_rng(1).permutation(len(x))
    order = np.resize(order, later_steps * plan.BATCH)
    first = order[: plan.BATCH]
    batch_x, batch_y = x[first], y[first]

    named = []

    def arm(method):
        inner = keras.optimizers.Adam(plan.LEARNING_RATE)
        one = training.arm(method, spec.build, initial, inner, spec.jit_compile)
        if method is plan.DIAGNOSED:
            diagnosis = keras_als.diagnose(one.model, batch_x, batch_y)
            diagnosis.apply(one.model)
            named[:] = diagnosis.layers
            one.model.compile(
                optimizer=one.optimizer, jit_compile=spec.jit_compile, auto_scale_loss=True
            )
            keras_als.calibrate(one.model, batch_x, batch_y)
        return one

    reference = arm(plan.METHODS[0])
    paths = [v.path for v in reference.model.trainable_variables]
    weights = {"start": initial}
    reference.model.fit(x[order], y[order], batch_size=plan.BATCH, shuffle=False, verbose=0)
    weights["later"] = reference.model.get_weights()
    float32 = {}
    for phase, w in weights.items():
        reference.model.set_weights(w)
        float32[phase] = true_gradients(
            reference.model, reference.optimizer, batch_x, batch_y, spec.jit_compile
        )
    layers = by_layer(paths)
    result = {
        "model": name,
        "later_steps": later_steps,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "code": provenance.code(),
        "phases": {},
    }
    for phase in weights:
        result["phases"][phase] = {
            "layers": {
                layer: gradient_range([float32[phase][i] for i in index])
                for layer, index in layers.items()
            },
            "methods": {},
        }
    for method in MIXED:
        for phase, w in weights.items():
            one = arm(method)  # a fresh one: "later" follows the method's own history
            skipped_training = 0
            if phase == "later":
                one.model.fit(x[order], y[order], batch_size=plan.BATCH, shuffle=False, verbose=0)
                skipped_training = one.skipped(later_steps)
            one.model.set_weights(w)
            one.optimizer.learning_rate = 0.0
            settle_x = np.concatenate([batch_x] * SETTLE)
            settle_y = np.concatenate([batch_y] * SETTLE)
            one.model.fit(settle_x, settle_y, batch_size=plan.BATCH, shuffle=False, verbose=0)
            one.optimizer.learning_rate = plan.LEARNING_RATE
            got = true_gradients(one.model, one.optimizer, batch_x, batch_y, spec.jit_compile)
            result["phases"][phase]["methods"][method.name] = {
                "lost": {
                    layer: lost_share([float32[phase][i] for i in index], [got[i] for i in index])
                    for layer, index in layers.items()
                },
                "lost_overall": lost_share(float32[phase], got),
                "finite": all(np.isfinite(g).all() for g in got),
                "scales": _scales(one.optimizer),
                "skipped_while_training": skipped_training,
                "float32_layers": list(named) if method is plan.DIAGNOSED else [],
            }
    return result


def _scales(optimizer) -> list[float]:
    """The method's loss scales now: keras_als's per layer, Keras's one, none."""
    if isinstance(optimizer, keras_als.AdaptiveLossScaleOptimizer):
        return sorted(set(optimizer.layer_scales().values()))
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return [float(optimizer.dynamic_scale.numpy())]
    return []


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.flat_regions.mechanism", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_STEPS} steps before later")
    parser.add_argument(
        "--models", nargs="+", choices=sorted(plan.MODELS), default=list(plan.MODELS)
    )
    parser.add_argument("--out", help="output folder (default benchmarks/results[/quick])")
    args = parser.parse_args(argv)
    from benchmarks.flat_regions import mechanism_report

    results = {
        "study": "flat_regions_mechanism",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python -m benchmarks.flat_regions.mechanism", *(argv or [])]),
        "environment": provenance.environment(),
        "provenance": provenance.code(),
        "models": [measure(m, QUICK_STEPS if args.quick else None) for m in args.models],
    }
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folder = args.out or os.path.join(here, "results", "quick" if args.quick else "")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "flat_regions_mechanism.json")
    if os.path.exists(path):  # each model can run in a process of its own
        with open(path) as f:
            earlier = [m for m in json.load(f)["models"] if m["model"] not in args.models]
        results["models"] = sorted(
            earlier + results["models"], key=lambda m: list(plan.MODELS).index(m["model"])
        )
        results["kept"] = [m["model"] for m in earlier]
    text = mechanism_report.markdown(results)
    with open(path, "w") as f:
        json.dump(results, f, indent=1)
    with open(os.path.join(folder, "flat_regions_mechanism.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
