"""The suite's targets and tables, on synthetic numbers (no training)."""

import math

import pytest

from benchmarks.suite import tables, targets
from benchmarks.suite.convergence import Run
from benchmarks.suite.fidelity import Measurement, compare, overall
from benchmarks.suite.records import Memory, Timing
from benchmarks.suite.targets import growth_exponent


def _measurement(case, method, error, underflow, phase="init"):
    layers = [("dense/kernel", error, underflow), ("dense/bias", error, underflow)]
    return Measurement(case, method, phase, layers, error, underflow, 0, 20)


def test_fidelity_target_needs_lower_error_everywhere_and_a_tenth_of_the_underflow():
    good = [
        _measurement("mlp", "keras_lso", 1e-2, 0.0),
        _measurement("mlp", "als_max_safe", 1.005e-2, 0.0),  # within the 1% tolerance
        _measurement("sigmoid", "keras_lso", 0.8, 0.4),
        _measurement("sigmoid", "als_max_safe", 2e-3, 0.01),
    ]
    assert targets.target_fidelity(good, hard={"sigmoid"}).passed
    worse_error = good[:3] + [_measurement("sigmoid", "als_max_safe", 0.9, 0.0)]
    target = targets.target_fidelity(worse_error, hard={"sigmoid"})
    assert not target.passed and "sigmoid/init: error" in target.line()
    too_much_underflow = good[:3] + [_measurement("sigmoid", "als_max_safe", 2e-3, 0.05)]
    assert not targets.target_fidelity(too_much_underflow, hard={"sigmoid"}).passed
    # Not a hard case: underflow is not judged.
    assert targets.target_fidelity(too_much_underflow, hard=set()).passed


def _run(task, method, seed, accuracy, skipped_after_100=0):
    return Run(task, method, seed, accuracy, 1100, skipped_after_100, skipped_after_100, 1.0)


def test_accuracy_target_uses_the_mean_over_seeds():
    runs = [
        _run("digits", m, s, a)
        for m, accs in {
            "float32": (0.950, 0.960, 0.970),
            "keras_lso": (0.950, 0.955, 0.960),
            "als_max_safe": (0.955, 0.956, 0.957),
        }.items()
        for s, a in enumerate(accs)
    ]
    assert targets.target_accuracy(runs).passed  # 95.60 vs 96.00 and 95.50
    low = [r for r in runs if r.method != "als_max_safe"] + [
        _run("digits", "als_max_safe", s, 0.953) for s in range(3)
    ]
    target = targets.target_accuracy(low)
    assert not target.passed
    assert "-0.70 points vs float32" in target.line() and "vs Keras LSO" in target.line()
    mean, spread, seeds = targets.accuracy_summary(runs)[("digits", "float32")]
    assert (round(mean, 6), round(spread, 6), seeds) == (96.0, 1.0, 3)


def _paired_runs(differences):
    """Runs of float32, Keras LSO and keras_als whose keras_als - LSO gaps are given."""
    runs = []
    for seed, difference in enumerate(differences):
        base = 0.93 + 0.002 * seed
        runs += [
            _run("mnist", "float32", seed, base),
            _run("mnist", "keras_lso", seed, base),
            _run("mnist", "als_max_safe", seed, base + difference),
        ]
    return runs


def test_a_shortfall_within_two_standard_errors_over_five_seeds_is_a_tie():
    # Paired differences -0.3, +0.2, -0.2, +0.1, 0.0 points: mean -0.04, s.e. 0.09.
    tie = targets.target_accuracy(_paired_runs([-0.003, 0.002, -0.002, 0.001, 0.0]))
    assert tie.passed, tie.line()
    assert "tied with Keras LSO within seed noise (paired -0.04 ± 0.09 s.e. over 5 seeds)" in (
        tie.line()
    )
    mean, error, seeds = targets.paired_difference(
        _paired_runs([-0.003, 0.002, -0.002, 0.001, 0.0]), "mnist", "als_max_safe"
    )
    # Deviations from the mean: -0.26, 0.24, -0.16, 0.14, 0.04; their squares sum to 0.172.
    assert (mean, error, seeds) == (pytest.approx(-0.04), pytest.approx((0.172 / 4 / 5) ** 0.5), 5)


def test_a_consistent_shortfall_or_too_few_seeds_is_below_keras_lso():
    # -0.2 points on every seed: the standard error is 0, so it is not noise.
    below = targets.target_accuracy(_paired_runs([-0.002] * 5))
    assert not below.passed
    assert "-0.20 points vs Keras LSO (paired -0.20 ± 0.00 s.e. over 5 seeds)" in below.line()
    few = targets.target_accuracy(_paired_runs([-0.003, 0.002, -0.002, 0.001]))
    assert not few.passed  # 4 seeds are too few to call a shortfall a tie


def test_skipped_steps_are_counted_per_1000_after_the_first_100():
    runs = [_run("digits", "als_max_safe", s, 0.9, skipped_after_100=1) for s in range(2)]
    assert targets.skipped_per_1000(runs, "digits", "als_max_safe") == 1.0  # 2 in 2 x 1000
    assert targets.target_skipped(runs).passed
    runs.append(_run("digits", "als_max_safe", 2, 0.9, skipped_after_100=3))
    assert not targets.target_skipped(runs).passed


def _timing(layers, als, lso, model="mlp"):
    return Timing(model, "als_max_safe", layers, als, lso, als / lso, 10, 10)


def test_step_time_target_checks_the_ratio_and_linear_growth():
    sweep = [_timing(10, 1.04, 1.0), _timing(50, 5.2, 5.0), _timing(200, 20.8, 20.0)]
    assert math.isclose(growth_exponent(sweep), 1.0)  # overhead 0.04, 0.2, 0.8 ms
    assert targets.target_step_time([_timing(5, 1.05, 1.0, "cnn")], sweep).passed
    assert not targets.target_step_time([_timing(5, 1.06, 1.0, "cnn")], sweep).passed
    quadratic = [_timing(10, 1.001, 1.0), _timing(50, 5.025, 5.0), _timing(200, 20.4, 20.0)]
    assert math.isclose(growth_exponent(quadratic), 2.0)  # overhead 1, 25, 400 µs
    assert not targets.target_step_time([], quadratic).passed
    flat_then_up = [_timing(10, 2.07, 2.0), _timing(50, 3.91, 3.81), _timing(200, 31.8, 31.3)]
    assert growth_exponent(flat_then_up) < 1.0  # overhead per layer 7, 2, 2.5 µs
    assert targets.target_step_time([], flat_then_up).passed
    noisy = sweep[:2] + [_timing(200, 19.9, 20.0)]  # no measurable overhead
    assert math.isnan(growth_exponent(noisy))
    assert targets.target_step_time([], noisy).passed


def test_step_time_ratios_carry_their_standard_error_into_the_table_and_the_target():
    import dataclasses

    from benchmarks.suite import tables

    slow = dataclasses.replace(_timing(5, 1.07, 1.0, "cnn"), ratio_se=0.012)
    target = targets.target_step_time([slow, _timing(5, 1.0, 1.0)], [])
    assert "worst ratio 1.070x ± 0.012 (cnn)" in target.summary
    assert target.detail == ["cnn: 1.070x ± 0.012"]
    table = tables.cost_table([slow, _timing(5, 1.0, 1.0)])
    assert "| 1.070 ± 0.012 |" in table and "| 1.000 |" in table  # unknown: no ± nan


def test_memory_target_checks_the_step_total_and_its_peak():
    memory = [
        Memory("cnn", "keras_lso", 1000, 900.0, 200.0, 500),
        Memory("cnn", "als_max_safe", 1040, 990.0, 250.0, 510),
    ]
    target = targets.target_memory(memory)
    assert target.passed, target.line()
    assert "step 1.040x, at peak 1.020x" in target.line() and "RSS 1.100x" in target.line()
    memory[1] = Memory("cnn", "als_max_safe", 1060, 900.0, 200.0, 500)
    assert not targets.target_memory(memory).passed  # the total over 1.05x
    memory[1] = Memory("cnn", "als_max_safe", 1000, 900.0, 200.0, 511)
    assert not targets.target_memory(memory).passed  # at peak over 1.02x
    memory[1] = Memory("cnn", "als_max_safe", 1000, 900.0, 200.0)
    assert not targets.target_memory(memory).passed  # at peak not read
    assert "at peak not read" in targets.target_memory(memory).line()


def test_error_and_underflow_definitions():
    import numpy as np

    reference = [np.array([1.0, 2.0, 0.0, 4.0]), np.array([3.0])]
    measured = [np.array([1.0, 0.0, 0.0, 4.0]), np.array([3.0])]
    rows = compare(reference, measured, ["a", "b"])
    assert rows[0][2] == 1 / 3  # one of three non-zero elements became zero
    assert math.isclose(rows[0][1], 2 / math.sqrt(21))
    assert rows[1][1:] == (0.0, 0.0)
    error, underflow = overall(reference, measured)
    assert math.isclose(error, 2 / math.sqrt(30)) and underflow == 0.25


def test_the_memory_table_gives_the_live_at_peak_ratio_where_it_was_read():
    rows = [
        Memory("cnn", "keras_lso", 1000, 900.0, 200.0, xla_peak_bytes=800),
        Memory("cnn", "als_max_safe", 1100, 990.0, 250.0, xla_peak_bytes=840),
        Memory("mlp", "keras_lso", 1000, 900.0, 200.0),
        Memory("mlp", "als_max_safe", 1000, 900.0, 200.0),
    ]
    table = tables.memory_table(rows).splitlines()
    assert "| cnn | 0.001 | 0.001 | 1.100 | 1.050 |" in table[2]
    assert "| 1.000 | not read |" in table[3]
