"""The suite's step-time and memory commands and their breakdowns, on
stand-ins or tiny models."""

import json
import math

import pytest

from benchmarks.harness import scaling
from benchmarks.suite import targets
from benchmarks.suite.records import Memory, Timing


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
