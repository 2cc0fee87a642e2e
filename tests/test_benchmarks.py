"""The benchmark report's PASS/FAIL logic, on synthetic numbers (no training)."""

import json
import math
import statistics

import pytest

from benchmarks.harness import scaling
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


def test_the_memory_breakdown_measures_each_variant_and_gives_ratios_to_keras(monkeypatch):
    from benchmarks.suite import memory

    asked = []

    def measure(model, method, steps=20, ablation=""):
        asked.append((model, method, ablation))
        total = {"keras_lso": 2**20, "als_max_safe": 2**21}.get(method, 2**20)
        return Memory(model, method, total, 900.0, 200.0, total // 2)

    monkeypatch.setattr(memory, "measure", measure)
    used = memory.breakdown("cnn_batchnorm")
    assert [a[1:] for a in asked] == list(memory.BREAKDOWN)
    names = [name for name, _ in used]
    assert names[:3] == ["keras_lso", "als_max_safe", "als_max_safe:no_crossing_reductions"]
    table = memory.breakdown_table("cnn_batchnorm", used)
    assert "| keras_lso | 1.00 (1.000x) | 0.50 (1.000x) |" in table
    assert "| als_max_safe | 2.00 (2.000x) | 1.00 (2.000x) |" in table


def test_the_memory_breakdown_writes_to_out_and_leaves_the_committed_results(
    monkeypatch, tmp_path, capsys
):
    from benchmarks.suite import memory

    def measure(model, method, steps=20, ablation=""):
        return Memory(model, method, 2**20, 900.0, 200.0, 2**19)

    monkeypatch.setattr(memory, "measure", measure)
    committed = open(memory.BREAKDOWN_RESULTS + ".json").read()
    out = str(tmp_path / "one_model")
    memory.main(["--breakdown", "--out", out, "mlp_50"])
    assert open(memory.BREAKDOWN_RESULTS + ".json").read() == committed
    assert "mlp_50: XLA step memory" in open(out + ".md").read()
    assert "--breakdown mlp_50" in open(out + ".json").read()
    for wrong in (["--breakdown", "--out"], ["--out", out, "mlp_50"], ["mlp_50"]):
        with pytest.raises(SystemExit):
            memory.main(wrong)
    errors = capsys.readouterr().err
    assert "expected one argument" in errors  # --out without its path
    assert "--out goes with --breakdown" in errors
    assert "one configuration is MODEL METHOD" in errors


def test_the_step_breakdown_writes_every_variant_to_out_and_leaves_the_committed_results(
    monkeypatch, tmp_path
):
    from benchmarks.suite import cost

    def run_all(blocks, steps, breakdown, models, instances):
        assert breakdown and models == ("deep_mlp",) and (blocks, steps, instances) == (2, 3, 4)
        return [
            Timing("deep_mlp", m.name, 9, 2.5, 2.0, 1.25, 2, 3, 4, 1.1, 0.05)
            for m in (scaling.ALS_MAX_SAFE, *cost.BREAKDOWN)
        ]

    monkeypatch.setattr(cost, "run_all", run_all)
    committed = open(cost.BREAKDOWN_RESULTS + ".json").read()
    out = str(tmp_path / "one_model")
    cost.main(
        ["--models", "deep_mlp", "--blocks", "2", "--steps", "3", "--instances", "4", "--out", out]
    )
    assert open(cost.BREAKDOWN_RESULTS + ".json").read() == committed
    table = open(out + ".md").read()
    saved = json.loads(open(out + ".json").read())
    command = "python -m benchmarks.suite.cost --models deep_mlp --blocks 2"
    assert saved["command"].startswith(command)
    assert cost.breakdown_markdown(saved) == table
    for m in (scaling.ALS_MAX_SAFE, *cost.BREAKDOWN):
        assert f"- `{m.name}`: {m.label}" in table
        assert (
            f"| deep_mlp | {m.name} | 9 | 2.00 | 2.50 | 1.250 ± 0.050 | 1.100 | 4 x 2 x 3 |"
            in table
        )


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


def test_the_memory_command_measures_every_model_under_both_methods(monkeypatch, capsys):
    from benchmarks.suite import memory

    asked = []

    def measure(model, method):
        asked.append((model, method))
        mine = method == targets.OURS
        return Memory(model, method, 1100 if mine else 1000, 900.0, 200.0, 500)

    monkeypatch.setattr(memory, "measure", measure)
    memory.main([])
    printed = capsys.readouterr().out
    assert sorted(asked) == sorted(
        (m, k) for m in memory.MODELS for k in (targets.BASELINE, targets.OURS)
    )
    assert "Target 5: FAIL" in printed and "step 1.100x, at peak 1.000x" in printed
    assert "| step live-at-peak ratio |" in printed


def test_the_memory_and_step_time_ablations_leave_the_crossing_reductions_out_and_back():
    import tensorflow as tf

    from benchmarks.harness import ablations
    from benchmarks.suite import cost
    from keras_als import _crossings

    boundary = object()

    def reductions():
        graph = tf.Graph()
        with graph.as_default():
            gradient = tf.constant([[-3.0, 2.0]])
            crossings = _crossings.Crossings(graph, None, False)
            crossings.arrived(boundary, [gradient])
            crossings.finish()
            return {b: tf.compat.v1.Session().run(r.amax) for b, r in crossings.reduced.items()}

    assert reductions() == {id(boundary): 3.0}
    with ablations.named("no_crossing_reductions"):
        assert reductions() == {}
    assert reductions() == {id(boundary): 3.0}
    with ablations.named(""):
        assert reductions() == {id(boundary): 3.0}
    with pytest.raises(ValueError, match="no_crossing_reductions"):
        ablations.named("no_such_thing")
    with cost._traced_for("als_no_crossing_reductions"):
        assert reductions() == {}
    with cost._traced_for("als_max_safe"):
        assert reductions() == {id(boundary): 3.0}
    assert reductions() == {id(boundary): 3.0}


def test_the_rescaling_ablation_hands_the_crossing_gradient_on_as_it_arrived_and_only_inside():
    """`without_boundary_rescaling` (the step breakdown's `no_boundary_rescaling`)
    leaves a boundary's gradient as it arrives, for a boundary that divides (rank
    2) and one that multiplies (rank 4); on exit, the boundaries divide by 4 (or
    multiply by 1/4) again, exactly."""
    import keras
    import tensorflow as tf

    from benchmarks.harness import ablations
    from keras_als import _boundary

    owner = keras.layers.Dense(1)  # held weakly by the boundary
    arriving = [1.0, -6.0, 2.0**-20, 3.0]

    def crossed(rank):
        inputs = tf.zeros([1] * (rank - 1) + [4])
        boundary = _boundary.Boundary(owner, [inputs], float("inf"))
        boundary.connect(tf.constant(4.0 if boundary.divides else 0.25), None)
        (gradient,) = boundary.backward(tf.reshape(tf.constant(arriving), inputs.shape))
        return boundary.divides, tf.reshape(gradient, [-1]).numpy().tolist()

    quarter = [v / 4 for v in arriving]
    assert crossed(2) == (True, quarter) and crossed(4) == (False, quarter)
    with ablations.without_boundary_rescaling():
        assert crossed(2) == (True, arriving) and crossed(4) == (False, arriving)
    assert crossed(2) == (True, quarter) and crossed(4) == (False, quarter)


def test_the_scheduling_ablations_reduce_the_same_values_at_other_points(monkeypatch):
    """With every arrival a group of its own: keras_als reduces it on arrival
    and hands back an exact zero read from the branch; `crossings_never_wait`
    reduces it so and hands back nothing; `crossings_reduced_last` reduces
    nothing before `finish`. The step-time breakdown traces its variant
    `als_crossings_never_wait` inside that ablation."""
    import tensorflow as tf

    from benchmarks.harness import ablations
    from benchmarks.suite import cost
    from keras_als import _crossings

    monkeypatch.setattr(_crossings, "WAITING_BYTES", 1)
    boundary = object()

    def arrive():
        graph = tf.Graph()
        with graph.as_default():
            crossings = _crossings.Crossings(graph, tf.constant(True), False)
            zero = crossings.arrived(boundary, [tf.constant([[-3.0, 2.0]])])
            reduced_on_arrival = bool(crossings.reduced)
            crossings.finish()
            session = tf.compat.v1.Session()
            amax = {b: session.run(r.amax) for b, r in crossings.reduced.items()}
            return reduced_on_arrival, amax, None if zero is None else session.run(zero)

    assert arrive() == (True, {id(boundary): 3.0}, 0.0)
    with ablations.named("crossings_never_wait"):
        assert arrive() == (True, {id(boundary): 3.0}, None)
    with ablations.named("crossings_reduced_last"):
        assert arrive() == (False, {id(boundary): 3.0}, None)
    assert arrive() == (True, {id(boundary): 3.0}, 0.0)
    with cost._traced_for("als_crossings_never_wait"):
        assert arrive() == (True, {id(boundary): 3.0}, None)


def test_only_a_gradient_that_fills_a_group_alone_waits_for_its_reductions(monkeypatch):
    import tensorflow as tf

    from benchmarks.harness import ablations
    from keras_als import _crossings

    monkeypatch.setattr(_crossings, "WAITING_BYTES", 12)  # two 8-byte gradients fill a group

    def waits(sizes):
        """For each arrival of a float32 gradient of `sizes[i]` values, whether it waits."""
        graph = tf.Graph()
        with graph.as_default():
            crossings = _crossings.Crossings(graph, tf.constant(True), False)
            return [crossings.arrived(object(), [tf.ones([n])]) is not None for n in sizes]

    assert waits([2, 2, 4]) == [False, False, True]
    with ablations.named("crossings_reduced_early"):
        assert waits([2, 2, 4]) == [False, True, True]
    with ablations.named("crossings_never_wait"):
        assert waits([2, 2, 4]) == [False, False, False]


def test_gradients_that_wait_for_their_reductions_train_bit_identically(monkeypatch):
    """float32, XLA, 2 steps of a small wrapped MLP, each crossing gradient a
    group of its own, so each waits for its branch: the exact zero added to
    each ratio leaves every weight as it is when none waits."""
    import keras
    import numpy as np

    import keras_als
    from benchmarks.harness import ablations
    from keras_als import _crossings

    monkeypatch.setattr(_crossings, "WAITING_BYTES", 1)
    x = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
    y = x[:, :1] * 3.0
    weights = []
    for ablation in ("", "crossings_never_wait"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
        )
        keras_als.wrap_model(model)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.Adam(1e-2), measure_every_n_steps=1
        )
        model.compile(optimizer, "mse", jit_compile=True)
        with ablations.named(ablation):
            for _ in range(2):
                model.train_on_batch(x, y)
        weights.append([keras.ops.convert_to_numpy(w) for w in model.weights])
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_step_time_breakdown_times_the_ablation_beside_keras_als_on_a_small_mlp():
    from benchmarks.suite import cost

    timings = cost.interleaved("mlp_4", 2, 2, cost.BREAKDOWN[2:], instances=1)
    assert [t.method for t in timings] == [
        "als_max_safe",
        "als_no_crossing_reductions",
        "als_crossings_never_wait",
    ]
    # Structure only: what the ratios are is the benchmark's to say, not a test's.
    assert all(t.layers == 4 and math.isfinite(t.ratio) and t.ratio > 0 for t in timings), timings


def test_the_compile_breakdown_gives_medians_and_ratios_paired_by_round_in_shuffled_orders(
    monkeypatch,
):
    from benchmarks.real_models import probes

    variants = probes.COMPILE_VARIANTS[:3]
    # Per round: keras 10, 12, 11; keras_als 13, 15, 14; the ablation 11.5, 11, 11.2.
    times = {
        "keras": [10.0, 12.0, 11.0],
        "keras_als": [13.0, 15.0, 14.0],
        "keras_als:no_crossing_reductions": [11.5, 11.0, 11.2],
    }
    asked = []

    def probe(kind, name, method, jit):
        asked.append((kind, name, method, jit))
        return {"first_step": times[method][(len(asked) - 1) // len(variants)]}

    monkeypatch.setattr(probes, "run_probe", probe)
    result = probes.compile_breakdown("m", repeats=3, variants=variants)
    assert result["seconds"] == {
        "keras": 11.0,
        "keras_als": 14.0,
        "keras_als:no_crossing_reductions": 11.2,
    }
    logs = [math.log(13 / 10), math.log(15 / 12), math.log(14 / 11)]
    ratio, error = result["ratio"]["keras_als"]
    assert ratio == pytest.approx(math.exp(sum(logs) / 3), rel=1e-12)
    assert error == pytest.approx(ratio * statistics.stdev(logs) / math.sqrt(3), rel=1e-12)
    assert result["ratio"]["keras"] == [1.0, 0.0]
    rounds = [[a[2] for a in asked[i : i + 3]] for i in (0, 3, 6)]
    assert rounds == result["orders"]
    assert all(sorted(order) == sorted(variants) for order in rounds)  # each once a round
    assert len({tuple(order) for order in rounds}) > 1  # not one fixed order
    assert all(a[0] == "compile" and a[3] for a in asked)


def test_the_real_model_table_gives_each_compile_variant_its_seconds_and_paired_ratio():
    from benchmarks.real_models import probes, report

    variants = probes.COMPILE_VARIANTS
    split = {
        "seconds": {v: 10.0 + i for i, v in enumerate(variants)},
        "ratio": {v: [1.0 + i / 10, i / 100] for i, v in enumerate(variants)},
        "samples": {v: [10.0 + i] * 4 for i, v in enumerate(variants)},
    }
    text = report.markdown({"batch": 8, "models": {"m": {"compile_breakdown": split}}})
    header = "| model | rounds (order) | " + " | ".join(variants) + " |"
    assert header in text
    row = text.splitlines()[text.splitlines().index(header) + 2]
    assert (
        row
        == "| m | 4 (fixed) | 10.0 | "
        + " | ".join(
            f"{10.0 + i:.1f} ({1.0 + i / 10:.2f}x ± {i / 100:.2f})" for i in range(1, len(variants))
        )
        + " |"
    )
    split["orders"] = [list(variants)] * 4
    text = report.markdown({"batch": 8, "models": {"m": {"compile_breakdown": split}}})
    assert "| m | 4 (shuffled) | 10.0 | " in text


def test_the_graph_table_gives_each_counted_variants_fusions_over_keras_and_a_dash_elsewhere():
    from benchmarks.real_models import report

    def row(fusions):
        kernels = {"keras": 30, "keras_als": 40, "wrapper_only_same_program": True}
        return {"graph_ops": {"keras": 100, "keras_als": 150}, "step_kernels": kernels | fusions}

    counted = {"keras": 200, "keras_als": 300, "optimizer_only": 220}
    counted["keras_als:no_crossing_reductions"] = 250
    models = {"a": row({"fusions": counted}), "b": row({"fusions": {"keras": 10, "keras_als": 20}})}
    lines = report.markdown({"batch": 8, "models": models}).splitlines()
    header = next(line for line in lines if line.startswith("| model | operations"))
    assert header.endswith("| keras_als:no_crossing_reductions | optimizer_only |")
    assert (
        "| a | 100 | 150 (1.50x) | 30 | 40 | yes | 200 | 300 (1.50x) | 250 (1.25x) | 220 (1.10x) |"
        in lines
    )
    assert "| b | 100 | 150 (1.50x) | 30 | 40 | yes | 10 | 20 (2.00x) | - | - |" in lines


def test_the_compile_and_memory_probes_build_each_variant_with_its_optimizer_and_wrap(
    monkeypatch, capsys
):
    from benchmarks.real_models import command

    built, stepped = [], []

    def build(name, method, seed=0, jit=True, wrap=None):
        built.append((method, seed, wrap))
        return object(), None

    monkeypatch.setattr(command, "build", build)
    monkeypatch.setattr(command, "data", lambda name, batches: (None, None))
    monkeypatch.setattr(command, "train_on_batch", lambda model, x, y: stepped.append(model))
    for variant in ("keras", "keras_als", "optimizer_only", "wrapper_only"):
        command._probe("compile", "m", variant, jit=True)
    assert built == [
        ("keras", 0, None),
        ("keras_als", 0, None),
        ("keras_als", 0, False),
        ("keras", 0, True),
    ]
    assert len(stepped) == 4
    assert capsys.readouterr().out.count('{"first_step": ') == 4
    for reading in ("xla_total", "xla_peak", "high_water_mb"):
        monkeypatch.setattr(command.xla_memory, reading, lambda *args: 1.0)
    command._probe("memory", "m", "optimizer_only", jit=True)
    assert built[-1] == ("keras_als", 0, False) and len(stepped) == 4 + 5
    assert '"xla_peak_bytes": 1.0' in capsys.readouterr().out


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


def test_the_worker_pool_renews_its_worker_and_does_not_hang(monkeypatch):
    import os

    from benchmarks.harness import isolation

    monkeypatch.setattr(isolation, "TASKS_PER_PROCESS", 2)
    with isolation.worker_pool() as pool:
        workers = [pool.submit(os.getpid).result(timeout=120) for _ in range(5)]
    assert len(set(workers)) == 3  # tasks 1-2, 3-4, 5


def _real_model_row(als_after_50, step_ratio=1.01, breakdown=None):
    row = {
        "steps": 1050,
        "keras": {"first_50": 6, "after_50": 1},
        "keras_als": {"first_50": 3, "after_50": als_after_50},
        "step_ratio": step_ratio,
        "compile_ratio": 1.08,
        "memory_ratio": 1.0,
        "memory_peak_ratio": 1.0,
        "compile_seconds": {"keras": 10.0, "keras_als": 10.8},
        "without_xla_seconds": {"keras": 5.0, "keras_als": 6.0},
    }
    if breakdown:
        row["breakdown_ms"] = breakdown
    return row


def test_breakdown_with_several_instances_gives_each_ratio_its_standard_error():
    from benchmarks.real_models import report

    row = _real_model_row(1, breakdown={"keras": 4.0, "keras_als": 4.1})
    row["breakdown_se"], row["breakdown_instances"] = {"keras": 0.0, "keras_als": 0.0125}, 3
    text = report.markdown({"batch": 8, "models": {"m": row}})
    assert "| m | 4.00 (1.000x ± 0.000), 3 instances each | - | 4.10 (1.025x ± 0.013) |" in text


def test_a_breakdown_over_processes_takes_each_ratio_from_the_processes_ratios(monkeypatch):
    from benchmarks.real_models import breakdown, probes, report

    ms = [{"keras": 4.0, "keras_als": 4.0}, {"keras": 2.0, "keras_als": 2.42}]
    runs = iter({"ms": each} for each in ms)
    asked = []

    def probe(kind, name, method, jit):
        asked.append((kind, name, method, jit))
        return next(runs)

    monkeypatch.setattr(probes, "run_probe", probe)
    result = breakdown.step_breakdown_in_processes("m", 2, 3, ("keras", "keras_als"))
    assert asked == [("breakdown", "m", "3:keras,keras_als", True)] * 2
    # Process ratios 1.0 and 1.21: geometric mean 1.1, log spread |log 1.21| / sqrt 2.
    assert result["process_ratios"]["keras_als"] == pytest.approx([1.0, 1.21])
    assert result["ms"]["keras_als"] / result["ms"]["keras"] == pytest.approx(1.1, rel=1e-12)
    error = 1.1 * math.log(1.21) / math.sqrt(2) / math.sqrt(2)
    assert result["ratio_se"]["keras_als"] == pytest.approx(error, rel=1e-12)
    assert result["ratio_se"]["keras"] == 0.0
    row = _real_model_row(1, breakdown=result["ms"])
    row["breakdown_se"], row["breakdown_instances"] = result["ratio_se"], 3
    row["breakdown_processes"] = 2
    text = report.markdown({"batch": 8, "models": {"m": row}})
    assert "(1.000x ± 0.000), 2 processes x 3 instances each | - | " in text
    assert f"(1.100x ± {error:.3f}) |" in text


def test_real_model_targets_allow_one_skip_per_1000_steps_after_the_first_50():
    from benchmarks.real_models import report

    assert all(report.verdicts(_real_model_row(1)).values())
    missed = report.verdicts(_real_model_row(2, step_ratio=1.04))
    assert [k for k, ok in missed.items() if not ok] == ["skips_after_50", "step_time"]


def test_real_model_cost_targets_are_issue_43s():
    from benchmarks.real_models import report

    row = _real_model_row(1, step_ratio=1.02)
    assert all(report.verdicts(row).values())
    over = {"step_ratio": 1.021, "compile_ratio": 1.11, "memory_ratio": 1.051}
    for key, value in {**over, "memory_peak_ratio": 1.021}.items():
        failed = [k for k, ok in report.verdicts({**row, key: value}).items() if not ok]
        assert len(failed) == 1, (key, failed)
    text = report.markdown({"batch": 8, "models": {"m": {**row, "memory_peak_ratio": 1.021}}})
    assert "| 1.000x (at peak 1.021x) | memory_at_peak |" in text


def test_a_row_with_the_step_time_alone_is_judged_on_it_alone():
    from benchmarks.real_models import report

    row = {"step_ratio": 1.01, "step_ratio_se": 0.015}
    assert report.verdicts(row) == {"step_time": True}
    assert report.missed(row) == ["step_time at the line"]


def test_real_model_table_gives_each_ablation_as_ms_and_a_ratio_to_keras():
    from benchmarks.real_models import report

    ms = {
        "keras": 5.0,
        "keras_als": 6.0,
        "measuring_never": 5.5,
        "no_boundary_reductions": 5.1,
        "no_boundary_rescaling": 5.3,
        "wrapper_only": 5.2,
    }
    text = report.markdown({"batch": 8, "models": {"m": _real_model_row(1, breakdown=ms)}})
    assert (
        "| m | 5.00 (1.000x) | - | 6.00 (1.200x) | - | 5.50 (1.100x) | 5.10 (1.020x) "
        "| 5.30 (1.060x) | - | 5.20 (1.040x) |" in text
    )
    assert "| m | 1050 | 6 / 3 | 1 / 1 | - | 1.010x | 1.080x (10.0 / 10.8) | 5.0 / 6.0 |" in text


def test_a_step_ratio_is_a_ratio_of_geometric_means_with_a_standard_error():
    from benchmarks.harness import stats

    ratio, standard_error = stats.ratio_and_standard_error([2.0, 8.0], [1.0, 4.0])
    # Geometric means 4 and 2; log spreads: var(log [2, 8]) = var(log [1, 4]) = 2 (log 2)^2.
    assert ratio == pytest.approx(2.0, rel=1e-12)
    assert standard_error == pytest.approx(2.0 * math.sqrt(2 * math.log(2) ** 2), rel=1e-12)
    same, none = stats.ratio_and_standard_error([1.1, 1.1, 1.1], [1.0, 1.0])
    assert same == pytest.approx(1.1, rel=1e-12) and none == 0.0
    assert math.isnan(stats.ratio_and_standard_error([1.0], [1.0, 2.0])[1])


def test_a_paired_ratio_takes_each_pair_s_ratio_and_refuses_unpaired_lists():
    from benchmarks.harness import stats

    # A drift that doubles both sides of the second pair leaves its ratio 2.
    ratio, standard_error = stats.paired_ratio_and_standard_error([2.0, 4.0], [1.0, 2.0])
    assert ratio == pytest.approx(2.0, rel=1e-12) and standard_error == pytest.approx(0.0)
    ratio, standard_error = stats.paired_ratio_and_standard_error([2.0, 8.0], [1.0, 1.0])
    # Log ratios log 2 and 3 log 2: mean 2 log 2, standard error log 2.
    assert ratio == pytest.approx(4.0, rel=1e-12)
    assert standard_error == pytest.approx(4.0 * math.log(2), rel=1e-12)
    with pytest.raises(ValueError, match="unpaired"):
        stats.paired_ratio_and_standard_error([1.0, 2.0], [1.0])


def test_real_model_table_gives_the_step_ratio_with_its_error_and_the_keras_spread():
    from benchmarks.real_models import report

    row = _real_model_row(1, step_ratio=1.04)
    row.update(step_ratio_se=0.012, keras_spread=1.031)
    text = report.markdown({"batch": 8, "models": {"m": row}})
    assert "| 1.040x ± 0.012 (1.03x) |" in text
    assert text.rstrip().endswith("| step_time |")
    row["step_instances"] = 6
    assert "| 1.040x ± 0.012 (1.03x), 6 instances |" in report.markdown(
        {"batch": 8, "models": {"m": row}}
    )
    row["step_processes"] = 5
    assert "| 1.040x ± 0.012 (1.03x), 5 processes x 6 instances |" in report.markdown(
        {"batch": 8, "models": {"m": row}}
    )


def test_step_time_over_processes_is_the_geometric_mean_with_the_error_of_their_spread():
    from benchmarks.real_models import timing

    # log ratios 0 and log 1.21: mean log 1.1, stdev log(1.21) / sqrt(2), s.e. half log(1.21)
    ratio, error = timing.ratio_over_processes([1.0, 1.21])
    assert ratio == pytest.approx(1.1, rel=1e-12)
    assert error == pytest.approx(1.1 * math.log(1.21) / 2, rel=1e-12)
    ratio, error = timing.ratio_over_processes([1.03, 1.03, 1.03])
    assert (ratio, error) == (pytest.approx(1.03, rel=1e-12), pytest.approx(0.0, abs=1e-12))
    assert math.isnan(timing.ratio_over_processes([1.02])[1])


def test_a_step_ratio_below_the_target_by_less_than_two_standard_errors_is_at_the_line():
    from benchmarks.real_models import report

    row = _real_model_row(1, step_ratio=1.015)
    assert report.missed({**row, "step_ratio_se": 0.003}) == ["step_time at the line"]
    assert report.missed({**row, "step_ratio_se": 0.002}) == []
    assert report.missed({**row, "step_ratio": 1.04, "step_ratio_se": 0.1}) == ["step_time"]


def test_the_log_says_when_the_parts_run_measured_no_target():
    from benchmarks.real_models import report

    assert report.missed_line({"compile_breakdown": {}}) == "none measured by these parts"
    row = _real_model_row(1, step_ratio=1.015)
    assert report.missed_line({**row, "step_ratio_se": 0.002}) == "none"
    assert report.missed_line({**row, "step_ratio": 1.04}) == "step_time"


def test_models_measured_for_skipped_steps_alone_get_a_table_of_their_own():
    from benchmarks.real_models import report

    skips_only = {
        "steps": 1050,
        "keras": {"first_50": 4, "after_50": 0},
        "keras_als": {"first_50": 5, "after_50": 2},
    }
    results = {"batch": 8, "models": {"m": _real_model_row(1), "convnext_tiny": skips_only}}
    text = report.markdown(results)
    main_table, other_table = text.split("Skipped steps (`--parts skips`)")
    assert "| m | 1050 | 6 / 3 |" in main_table and "convnext_tiny" not in main_table
    assert "| convnext_tiny | 1050 | 4 / 5 | 0 / 2 | - | - | skips_first_50, skips_after_50 |" in (
        other_table
    )
    skips_only["keras_als"]["measured_steps"] = 91
    skips_only.update(step_ratio=1.015, step_ratio_se=0.001, keras_spread=1.03)
    other_table = report.markdown(results).split("Skipped steps (`--parts skips`)")[1]
    assert "| 0 / 2 | 91 steps | 1.015x ± 0.001 (1.03x) | skips_first_50, skips_after_50 |" in (
        other_table
    )


def test_an_unknown_real_model_name_is_an_error_that_lists_the_known_ones():
    from benchmarks.real_models import architectures

    assert architectures.builder("convnext_tiny") is architectures.OTHER_FAMILIES["convnext_tiny"]
    with pytest.raises(ValueError, match="Unknown model 'resnet18'.*gpt2_tiny.*gemma_tiny"):
        architectures.builder("resnet18")


def test_measuring_one_methods_skips_keeps_the_others_row_or_says_there_is_none(tmp_path):
    from benchmarks.real_models import command

    out = str(tmp_path / "real_models")
    with pytest.raises(ValueError, match="--methods takes keras, keras_als or both"):
        command.main(["--parts", "skips", "--methods", "als", "--out", out])
    with pytest.raises(ValueError, match="no row of keras with 3 steps to keep"):
        command.main(["--parts", "skips", "--methods", "keras_als", "--steps", "3", "--out", out])


def test_the_kernels_of_a_compiled_step_are_its_entry_instructions_that_run_work():
    from benchmarks.real_models import programs

    hlo = """HloModule step

%fused_computation (p: f32[4]) -> f32[4] {
  %p = f32[4]{0} parameter(0)
  ROOT %m = f32[4]{0} multiply(f32[4]{0} %p, f32[4]{0} %p)
}

ENTRY %main (a: f32[4], b: f32[4,4]) -> (f32[4], f32[4]) {
  %a = f32[4]{0} parameter(0)
  %b = f32[4,4]{1,0} parameter(1)
  %c = f32[] constant(1)
  %fusion = f32[4]{0} fusion(f32[4]{0} %a), kind=kLoop, calls=%fused_computation
  %dot = f32[4]{0} dot(f32[4,4]{1,0} %b, f32[4]{0} %fusion), lhs_contracting_dims={1}
  %bitcast = f32[4]{0} bitcast(f32[4]{0} %dot)
  %copy = f32[4]{0} copy(f32[4]{0} %bitcast)
  ROOT %tuple = (f32[4]{0}, f32[4]{0}) tuple(f32[4]{0} %fusion, f32[4]{0} %copy)
}
"""
    assert programs.kernels_of(hlo) == 3  # the fusion, the dot and the copy


def test_one_program_is_one_up_to_names_parameter_order_and_unread_instructions():
    from benchmarks.real_models import programs

    def step(first, second, dead=""):
        return f"""HloModule {first}

ENTRY %main.{second} (a: f32[4], b: f32[4]) -> (f32[4]) {{
  %{first} = f32[4]{{0}} parameter(0)
  %{second} = f32[4]{{0}} parameter(1)
  %z = f16[] constant(0){dead}
  %m = f32[4]{{0}} multiply(f32[4]{{0}} %{first}, f32[4]{{0}} %{second})
  ROOT %t = (f32[4]{{0}}) tuple(f32[4]{{0}} %m)
}}
"""

    plain = step("a", "b")
    unread = "\n  %zeros = f16[8]{0} broadcast(f16[] %z), dimensions={}"
    assert programs.same_program(plain, step("x", "y", unread))  # names, an unread broadcast
    assert not programs.same_program(plain, step("a", "b").replace(" multiply(", " add("))
    read = step("a", "b").replace("tuple(f32[4]{0} %m)", "tuple(f32[4]{0} %z)")
    assert not programs.same_program(plain, read)


def test_kernels_that_only_feed_a_conditional_are_found_through_its_operand_tuple():
    from benchmarks.real_models import programs

    hlo = """HloModule m

%b (t: (f16[4])) -> f32[] {
  %t = (f16[4]{0}) parameter(0)
  ROOT %z = f32[] constant(0)
}

ENTRY %main (a: f32[4], p: pred[]) -> (f32[4], f32[]) {
  %a = f32[4]{0} parameter(0)
  %p = pred[] parameter(1)
  %rounded = f16[4]{0} fusion(f32[4]{0} %a), kind=kLoop, calls=%round
  %shared = f16[4]{0} fusion(f32[4]{0} %a), kind=kLoop, calls=%round
  %used = f32[4]{0} fusion(f16[4]{0} %shared), kind=kLoop, calls=%widen
  %operands = (f16[4]{0}, f16[4]{0}) tuple(f16[4]{0} %rounded, f16[4]{0} %shared)
  %nothing = () tuple()
  %cond = f32[] conditional(%p, %operands, %nothing), true_computation=%b, false_computation=%b
  ROOT %out = (f32[4]{0}, f32[]) tuple(f32[4]{0} %used, f32[] %cond)
}
"""
    # %shared feeds the branch and %used; only %rounded exists for the branch alone
    assert programs.for_branches_only(hlo) == ["%rounded"]


def test_hlo_instructions_count_under_the_tensorflow_operation_that_made_them():
    from benchmarks.real_models import programs

    def meta(op_name):
        return f', metadata={{op_type="X" op_name="{op_name}"}}'

    hlo = f"""HloModule m

%branch (t: (f16[4])) -> f32[] {{
  %t = (f16[4]{{0}}) parameter(0)
  %g = f16[4]{{0}} get-tuple-element((f16[4]{{0}}) %t), index=0
  %w = f32[4]{{0}} convert(f16[4]{{0}} %g){meta("cond_3/Mean_2")}
  %z = f32[] constant(0){meta("cond_3/Mean_2")}
  ROOT %r = f32[] reduce(f32[4]{{0}} %w, f32[] %z), to_apply=%add{meta("cond_1/Mean")}
}}

ENTRY %main (a: f32[4]) -> f32[4] {{
  %a = f32[4]{{0}} parameter(0)
  %m = f32[4]{{0}} multiply(f32[4]{{0}} %a, f32[4]{{0}} %a){meta("gradient_tape/m_1/d_2/mul_3")}
  ROOT %n = f32[4]{{0}} negate(f32[4]{{0}} %m){meta("Neg")}
}}
"""
    assert programs.origins_of(hlo) == {
        "cond/Mean": 3,  # numbers dropped: one origin in every branch
        "(none)": 3,  # parameters and the tuple's element
        "gradient_tape/.../mul": 1,  # the layer's path between left out
        "Neg": 1,
    }


def test_the_wrap_sweep_builds_tiny_backbones_and_says_what_a_constructor_lacks():
    pytest.importorskip("keras_hub")
    from benchmarks.profiles import wrap_sweep

    backbone = wrap_sweep.tiny_backbone("LlamaBackbone")
    assert (backbone.num_layers, backbone.hidden_dim, backbone.num_key_value_heads) == (2, 32, 1)
    with pytest.raises(TypeError, match=r"CLIPBackbone needs \['vision_encoder'"):
        wrap_sweep.tiny_backbone("CLIPBackbone")


def test_the_wrap_sweep_row_of_a_small_model_keeps_its_weights_and_has_both_skip_counts():
    import keras

    from benchmarks.profiles import wrap_sweep

    def make(input_scale=None):
        inputs = keras.Input((8, 8, 3))
        x = inputs if input_scale is None else keras.layers.Rescaling(input_scale)(inputs)
        hidden = keras.layers.Conv2D(4, 3, activation="relu")(x)
        pooled = keras.layers.GlobalAveragePooling2D()(hidden)
        return keras.Model(inputs, keras.layers.Dense(10, dtype="float32")(pooled))

    row = wrap_sweep.try_model(make, steps=3)
    assert row["weights_equal"] and row["outputs_equal"] and row["warnings"] == 0
    assert row["scales"] == 3  # the loss, the convolution, the head
    # Standard-normal inputs through three small layers: every gradient times either
    # optimizer's first scale (2^15) stays finite in float16, so no step is skipped.
    assert (row["keras"], row["keras_als"]) == (0, 0)
    assert row["weights_not_finite"] == {"keras": 0, "keras_als": 0}
    # The count can see a skip: inputs times 10^4 make the convolution's float16
    # gradient overflow on all three steps at either optimizer's scales.
    spiked = wrap_sweep.try_model(lambda: make(input_scale=1e4), steps=3)
    assert (spiked["keras"], spiked["keras_als"]) == (3, 3)
    assert spiked["weights_not_finite"] == {"keras": 0, "keras_als": 0}
    table = wrap_sweep.markdown({"small": row, "broken": {"error": "keras_als: ValueError"}}, 3)
    assert f"| small | True | True | 0 | 3 | {row['keras']} / {row['keras_als']} | 0 / 0 |" in table
    assert "| broken |  |  | | | keras_als: ValueError | |" in table


def _xspace(lines: dict[str, list[tuple[str, float, float]]]):
    """An XSpace with one plane and, per line, events `(name, start us, end us)`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}
    for k, (line_name, events) in enumerate(lines.items()):
        line = plane.lines.add(id=k, name=line_name, timestamp_ns=0)
        for name, start, end in events:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].id = ids[name]
                plane.event_metadata[ids[name]].name = name
            line.events.add(
                metadata_id=ids[name],
                offset_ps=int(start * 1e6),
                duration_ps=int((end - start) * 1e6),
            )
    return space


def test_the_step_profile_splits_a_step_into_python_launch_program_and_kernel_kinds():
    from benchmarks.profiles import step_profile

    space = _xspace(
        {
            "main": [
                ("step:keras_als/0", 0, 1000),
                ("one_step_on_data", 50, 950),  # Python's trace, not a kernel
                ("EagerLocalExecute: __inference_one_step_on_data_12", 100, 900),
                (step_profile.PROGRAM, 200, 800),
                ("convert_multiply_fusion.3", 250, 350),
                ("cond.2", 400, 600),
                ("add_fusion.7", 450, 500),  # inside the branch
                ("dot.4", 650, 750),
                ("MatMul", 660, 740),  # the dot's library call: the dot's own time
                ("fusion.9", 960, 990),  # after the program: not counted
            ],
            "worker": [("convert_multiply_fusion.5", 300, 320)],
        }
    )
    (step,) = step_profile.split(space)["keras_als/0"]
    expected = {
        "step": 1000,
        "launch": 200,  # 800 in the call, 600 of them the program's
        "program": 600,
        "python": 200,
        "kernel:convert_multiply_fusion": 120,  # both lines
        "kernel:cond": 150,
        "kernel:add_fusion": 50,
        "kernel:dot": 100,
    }
    assert step == pytest.approx(expected, abs=1e-6)


def test_the_step_profile_compares_each_variant_with_keras_over_instances():
    from benchmarks.profiles import step_profile

    steps = {}
    for k, offset in enumerate((0.0, 40.0)):  # two instances of each
        for v, extra in zip(step_profile.VARIANTS, (0.0, 100.0, 10.0, 30.0)):
            steps[f"{v}/{k}"] = [
                {"step": 1000 + offset + extra + d, "python": 300, "launch": 200, "program": 500}
                for d in (-5, 0, 50)
            ]
    summary = step_profile.summarize(steps, 2)
    assert summary["us"]["keras"]["step"] == pytest.approx(1020.0)  # medians 1000 and 1040
    assert summary["difference_us"]["keras_als"]["step"] == pytest.approx(100.0)
    assert summary["difference_us"]["optimizer_only"]["step"] == pytest.approx(30.0)
    assert summary["keras_spread_us"]["step"] == pytest.approx(40.0)
    table = step_profile.markdown({"models": {"gpt2_tiny": summary}})
    assert "| step | 1020 | +100 | +10 | +30 | 40 |" in table
    assert "| launch | 200 | +0 | +0 | +0 | 0 |" in table


def test_instance_groups_alternate_which_method_is_built_first():
    from benchmarks.harness import isolation

    methods = ("keras", "keras_als", "wrapper_only")
    orders = [isolation.in_build_order(methods, k) for k in range(4)]
    assert orders == [methods, methods[::-1], methods, methods[::-1]]
    firsts = [order[0] for order in orders]
    assert firsts.count("keras") == firsts.count("wrapper_only") == 2


def test_memory_reads_the_total_and_the_peak_of_the_largest_compiled_step(tmp_path):
    """XLA's buffer-assignment dumps, as it writes them (numbers from a real
    dump): the total and the peak usage both come from the module with the
    largest total, the peak's digits grouped by spaces."""
    from benchmarks.harness import xla_memory

    def dump(name, total, peak):
        path = tmp_path / f"module_{name}.train_step.cpu_after_optimizations-buffer-assignment.txt"
        path.write_text(
            f"BufferAssignment:\nTotal bytes used: {total} (3.08MiB)\n"
            f"  Stack trace breakdown for peak usage: {peak} bytes\n"
        )

    dump("0001", 3225614, "2 571 526")
    dump("0002", 1024, "1 000")  # a smaller compiled version of the step
    assert xla_memory.xla_total(str(tmp_path)) == 3225614
    assert xla_memory.xla_peak(str(tmp_path)) == 2571526


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


def test_the_trace_profile_splits_a_first_step_and_counts_keras_als_s_branches(capsys, monkeypatch):
    """A tiny GPT-2's first step without XLA, for both methods: the time in
    TensorFlow's runtime is found (else `graph` reads 0), keras_als's step
    builds more conditionals than Keras's apply-or-skip, and only its profile
    lists keras_als's functions."""
    from benchmarks.profiles import trace_profile

    rows = {m: trace_profile.first_step("gpt2_tiny", m, top=3) for m in trace_profile.METHODS}
    for row in rows.values():
        assert 0 < row["graph"] < row["seconds"] and row["trace"] > 0, row
    assert rows["keras"]["conditionals"] >= 1
    assert rows["keras_als"]["conditionals"] > rows["keras"]["conditionals"], rows
    assert rows["keras"]["keras_als"] == [] and len(rows["keras_als"]["keras_als"]) == 3
    printed = trace_profile.table("gpt2_tiny", rows)
    assert "| keras_als |" in printed and "_apply_phases.py:run" in printed
    profiled = []
    monkeypatch.setattr(trace_profile, "first_step", lambda *args: profiled.append(args))
    with pytest.raises(SystemExit):
        trace_profile.main(["--models", "gpt2_tiny,vgg16"])
    assert "Unknown model 'vgg16'" in capsys.readouterr().err
    assert profiled == []  # refused before profiling the valid name given first


def test_a_kerashub_task_s_cost_row_has_dashes_for_skips_and_the_table_names_its_batch():
    from benchmarks.real_models import report

    task = _real_model_row(0)
    for measured_by_its_section in ("steps", "keras", "keras_als"):
        del task[measured_by_its_section]
    text = report.markdown({"batch": 8, "models": {"m": _real_model_row(0), "retinanet": task}})
    assert "| retinanet | - | - | - | - | 1.010x | 1.080x (10.0 / 10.8) |" in text
    assert "The KerasHub tasks (retinanet) are issue 40's sections' models at their batch, 16" in (
        text.replace("\n", " ")
    )
    plain = report.markdown({"batch": 8, "models": {"m": _real_model_row(0)}})
    assert "KerasHub tasks" not in plain


def test_the_real_model_command_refuses_skips_on_a_kerashub_task_and_names_its_section(tmp_path):
    from benchmarks.real_models import command

    out = str(tmp_path / "real_models")
    with pytest.raises(ValueError, match="benchmarks.keras_hub_tasks"):
        command.main(["--parts", "skips", "--models", "gpt2_tiny,gemma_lora", "--out", out])


def test_the_memory_breakdown_gives_each_variant_its_total_and_peak_over_keras(monkeypatch):
    from benchmarks.real_models import probes, report

    peaks = {"keras": 100, "keras_als": 109, "optimizer_only": 100}
    asked = []

    def memory_of(name, variant):
        asked.append(variant)
        return {"xla_bytes": 2e6, "xla_peak_bytes": peaks.get(variant, 104) * 1e4}

    monkeypatch.setattr(probes, "memory_of", memory_of)
    split = probes.memory_breakdown("m")
    assert asked == list(probes.COMPILE_VARIANTS)
    assert split["ratio"]["keras_als"] == [1.0, 1.09]
    row = _real_model_row(0)
    row["memory_breakdown"] = split
    text = report.markdown({"batch": 8, "models": {"m": row}})
    line = next(x for x in text.splitlines() if x.startswith("| m | 2.0 MB"))
    assert line.startswith("| m | 2.0 MB (at peak 1.0) | 1.000x (at peak 1.090x) | ")
    assert line.count("(at peak 1.040x)") == 2
