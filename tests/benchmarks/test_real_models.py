"""The real models' study: its breakdowns, targets, tables and command, on synthetic numbers."""

import math
import statistics

import pytest


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
