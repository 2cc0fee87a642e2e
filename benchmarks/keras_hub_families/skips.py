"""Where keras_als skipped a step that Keras's optimizer did not, on one family.

`python -m benchmarks.keras_hub_families.skips --family qwen --seed 1
[--measure-every-n-steps N]` trains Keras's `LossScaleOptimizer` and keras_als
(`wrap_model`, the default policy) as the sweep does (the family's build, the
seed's weights and batches, Adam 1e-3, batch 4, 40 steps, no XLA), one step
at a time, and prints every step that either skipped, with the scales keras_als
used in it where the overflow started (`telemetry()["last_overflow_step"]`),
beside Keras's one scale. `--measure-every-n-steps 1` measures the scales on
every step: a skip that remains then is not the measuring period's.

A scale of `2**k` set from the last step's largest crossing gradient `amax`
(`MaxSafe`: `2**k <= FLOAT16_MAX / 2**margin / amax`) overflows only where a
value of the component's backward pass exceeds `FLOAT16_MAX / 2**k`, at least
`2**margin` times `amax`; Keras's scale overflows there only if the value also
exceeds `FLOAT16_MAX / scale_keras`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math

from benchmarks.harness import scaling
from benchmarks.keras_hub_families import families, study


def trace(
    name: str,
    seed: int,
    measure_every_n_steps: int | None = None,
    steps: int = study.BLOCKS * study.STEPS_PER_BLOCK,
) -> list[dict]:
    """One dict per step either optimizer skipped (of the first `steps`): the
    step, what each did, and keras_als's scales (used in that step) where its
    overflow started."""
    given = study.setting(name, seed, steps)
    x, y, order = given.x, given.y, given.order
    als = dataclasses.replace(scaling.ALS_MAX_SAFE, measure_every_n_steps=measure_every_n_steps)
    keras_arm, als_arm = (study.arm(method, given, seed) for method in (scaling.KERAS_LSO, als))
    events = []
    for step in range(steps):
        rows = order[step * study.BATCH : (step + 1) * study.BATCH]
        keras_scale = float(
            keras_arm.optimizer.dynamic_scale if step else keras_arm.optimizer.initial_scale
        )
        als_scales = als_arm.optimizer.layer_scales() if step else {}
        skipped = []
        for one in (keras_arm, als_arm):
            before = one.skipped(step) if step else 0
            one.model.train_on_batch(study._rows(x, rows), y[rows])
            skipped.append(one.skipped(step + 1) > before)
        if not any(skipped):
            continue
        last = als_arm.optimizer.telemetry(warn=False)["last_overflow_step"]
        started = [k for k, s in last.items() if s == step] if skipped[1] else []
        origins = {k: als_scales.get(k, als_arm.optimizer.initial_scale) for k in started}
        events.append(
            {
                "step": step,
                "keras_skipped": skipped[0],
                "keras_scale": keras_scale,
                "keras_als_skipped": skipped[1],
                "keras_als_origins": origins,
            }
        )
    return events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", required=True, choices=sorted(families.FAMILIES))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--measure-every-n-steps", type=int, default=None)
    args = parser.parse_args(argv)
    print("\n".join(table(trace(args.family, args.seed, args.measure_every_n_steps))))
    return 0


def table(events: list[dict]) -> list[str]:
    """`trace`'s events as the lines of a markdown table."""
    lines = [
        "| step | Keras LSO skipped (its scale) | keras_als skipped | where it started: scale |",
        "| --- | --- | --- | --- |",
    ]
    for e in events:
        scales = e["keras_als_origins"].items()
        origins = ", ".join(f"`{k}`: 2^{math.log2(v):.0f}" for k, v in scales)
        lines.append(
            f"| {e['step']} | {e['keras_skipped']} (2^{math.log2(e['keras_scale']):.0f}) "
            f"| {e['keras_als_skipped']} | {origins or '-'} |"
        )
    return lines if events else [*lines, "| - | no step skipped by either | - | - |"]


if __name__ == "__main__":
    raise SystemExit(main())
