"""Heavy-tailed losses (issue 17): rare large-loss samples must not make keras_als
skip many more steps than Keras's LossScaleOptimizer on the same batches.

The training case is a small version of `benchmarks.heavy_tails`'s reproducer:
teacher regression with 1% of the targets multiplied by 10^4, so about half of
the batches hold a spike; both methods train from the same weights on the same
batches (`benchmarks.heavy_tails.training.train`, `model.fit(jit_compile=True,
shuffle=False)` on a permuted copy of the rows).
"""

import dataclasses

import pytest

from benchmarks.heavy_tails import plan, report, training

SMALL = dataclasses.replace(
    plan.SETTINGS[0],
    name="mlp_1e4_1pct",  # judged like the reproducer (held-out MSE)
    rows=6_400,  # 100 batches of 64
    epochs=3,  # 300 steps
    layers=4,
    width=32,
)


@pytest.mark.slow
def test_keras_als_skips_no_more_than_keras_on_the_same_spiky_batches():
    keras_lso = training.train(SMALL, "keras_lso", seed=0)
    ours = training.train(SMALL, "keras_als", seed=0)
    assert keras_lso.steps == ours.steps == 300
    assert keras_lso.spike_batches == ours.spike_batches > 100  # the same spiky batches
    # The case must overflow, or the comparison below proves nothing: Keras's
    # scale (2^15) overflows on the first spikes, and keras_als learns headroom.
    assert keras_lso.skipped >= 1
    assert max(ours.telemetry["headroom"].values()) > 0
    assert sum(ours.telemetry["overflows"].values()) >= 1
    # Its own counter agrees with steps run minus applied steps.
    assert ours.skipped_steps == ours.skipped == ours.telemetry["skipped_steps"]
    # No more than Keras (2 and 8 of 300 on this CPU). The benchmark's judge
    # allows twice Keras's, for its larger settings and five seeds.
    assert ours.skipped <= keras_lso.skipped, (ours.skipped_at, keras_lso.skipped_at)


def _run(setting, method, seed, outcome, skipped, steps=1000):
    return training.Run(
        setting, method, seed, outcome, steps, skipped, None, [], 0, 0, True, seconds=1.0
    )


def test_judge_fails_on_too_many_skips_and_on_a_worse_outcome_beyond_seed_noise():
    name = "mlp_1e4_1pct"  # outcome: held-out MSE, lower is better
    keras_lso = [_run(name, "keras_lso", s, 1.0 + 0.1 * s, 3) for s in range(5)]

    def ours(outcomes, skipped):
        return [_run(name, "keras_als", s, o, skipped) for s, o in enumerate(outcomes)]

    good = ours([1.0 + 0.1 * s for s in range(5)], 1)
    assert report.judge(keras_lso + good, name).passed
    # 5 runs x 1000 steps: allowed max(2 x 15, 25) = 30 skips in all.
    assert report.judge(keras_lso + ours([1.0] * 5, 6), name).passed
    many = report.judge(keras_lso + ours([1.0] * 5, 7), name)
    assert not many.passed and "too many" in many.skips
    # Worse by 0.5 at every seed: far outside seed noise.
    worse = report.judge(keras_lso + ours([1.5 + 0.1 * s for s in range(5)], 0), name)
    assert not worse.passed and "worse than Keras LSO" in worse.outcome
    # Worse on average but spread: a tie within two standard errors.
    noisy = report.judge(keras_lso + ours([1.1, 1.7, 1.0, 1.2, 1.4], 0), name)
    assert noisy.passed and "tie" in noisy.outcome
    # A non-finite outcome fails.
    nan = report.judge(keras_lso + ours([float("nan")] + [1.0] * 4, 0), name)
    assert not nan.passed


def test_judge_reads_accuracy_as_higher_is_better():
    name = "digits_cnn_w1e3"
    keras_lso = [_run(name, "keras_lso", s, 0.90, 0, 270) for s in range(5)]
    better = [_run(name, "keras_als", s, 0.92, 0, 270) for s in range(5)]
    lower = [_run(name, "keras_als", s, 0.88 + 0.001 * s, 0, 270) for s in range(5)]
    assert report.judge(keras_lso + better, name).passed
    verdict = report.judge(keras_lso + lower, name)
    assert not verdict.passed and "points" in verdict.outcome
