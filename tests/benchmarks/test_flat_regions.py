"""The flat-regions study (`benchmarks/flat_regions`): its data, its tables, one tiny run."""

import dataclasses
import json
import math

import numpy as np
import pytest

from benchmarks.flat_regions import command, models, plan, report


def test_the_canvases_background_is_exactly_zero_and_the_targets_match_the_digits():
    images, labels = models.classification("test")
    assert images.shape == (256, 32, 32, 3) and labels.shape == (256,)
    assert np.mean(images == 0.0) > 0.8 and images.max() <= 1.0
    assert set(np.unique(labels)) <= set(range(10)) and len(np.unique(labels)) == 10
    images, masks = models.segmentation("test")
    assert images.shape[1:] == (64, 64, 3) and masks.shape[1:] == (64, 64, 11)
    np.testing.assert_array_equal(masks.sum(-1), 1.0)  # one class a pixel
    background = masks[..., 0] == 1
    assert 0.5 < background.mean() < 1.0


def _row(model, method, seed, outcome, skipped, **extra):
    return {
        "model": model,
        "method": method,
        "seed": seed,
        "outcome": outcome,
        "metric": 0.5,
        "skipped": skipped,
        "step_seconds": 0.01,
        "steps": 600,
    } | extra


def test_the_comparisons_pair_by_seed_and_name_the_seeds_where_keras_als_skips_more():
    rows = []
    for seed, (f32, ours, diagnosed) in enumerate(
        [(2.0, 2.1, 2.0), (2.2, 2.2, 2.21), (2.1, 2.3, 2.1)]
    ):
        rows += [
            _row("swin", "float32", seed, f32, 0),
            _row("swin", "mixed_no_scaling", seed, math.nan, 0),
            _row("swin", "keras_lso", seed, 2.5, 30),
            _row("swin", "als_max_safe", seed, ours, 304 if seed == 1 else 5),
            _row(
                "swin",
                plan.DIAGNOSED.name,
                seed,
                diagnosed,
                10,
                float32_layers=["patch_embedding/norm"],
                diagnose_seconds=0.5,
            ),
            _row(
                "swin",
                plan.FALLBACK.name,
                seed,
                diagnosed,
                12,
                fallback_applied=[[8, ["patch_embedding/norm", "stage_0/norm1"]]] if seed else [],
            ),
        ]
    lines = report.comparisons(rows, "swin")
    # keras_als minus float32: +0.1, 0.0, +0.2: mean 0.1, s.e. 0.0577.
    assert lines[0].startswith("- als_max_safe: held-out loss minus float32's +0.1000 ± 0.0577")
    assert "within two standard errors" in lines[0] and "on seeds: [1]." in lines[0]
    assert "on seeds: none." in lines[1] and lines[2].startswith("- als_fallback:")
    assert "patch_embedding/norm" in lines[3]
    assert lines[5] == (
        "- Layers `Float32Fallback` set to float32: seed 0: none; seed 1: 2 at step 8; "
        "seed 2: 2 at step 8."
    )
    table = report.table(rows, "swin")
    assert any("| not finite |" in line and "3 of 3" in line for line in table)
    assert any("| 104.7 (5-304) |" in line for line in table)


def test_seeds_added_to_the_first_plan_s_are_compared_with_and_without_them():
    differences = {1: 0.1, 2: 0.3, 3: 0.2, 4: 0.1, 5: 0.3, 6: -0.1, 7: 0.0}
    rows = []
    for seed, difference in differences.items():
        rows += [
            _row("swin", "float32", seed, 2.0, 0),
            _row("swin", "als_max_safe", seed, 2.0 + difference, 0),
        ]
    # All 7: mean 0.1286, sd 0.1495, s.e. 0.0565; seeds 1-5: mean 0.2, s.e. 0.0447.
    line = report.comparisons(rows, "swin")[0]
    assert line.startswith(
        "- als_max_safe: held-out loss minus float32's +0.1286 ± 0.0565 (7 seeds, "
        "higher (worse) beyond two standard errors) (the first plan's seeds 1-5 alone: "
        "+0.2000 ± 0.0447 (5 seeds, higher (worse) beyond two standard errors));"
    )
    assert "first plan" not in report.comparisons(rows[:10], "swin")[0]


@pytest.mark.slow
def test_one_seed_of_the_study_runs_every_method_on_the_vit(monkeypatch):
    # Without XLA: compiling each arm's steps would take most of the test's time
    # (the study runs with XLA; test_calibration.py and test_diagnosis.py train Swin with it).
    vit = dataclasses.replace(plan.MODELS["vit"], jit_compile=False)
    monkeypatch.setitem(plan.MODELS, "vit", vit)
    rows = plan.run_seed("vit", 1, blocks=2, steps_per_block=2)
    assert [r["method"] for r in rows] == [m.name for m in plan.METHODS]
    assert all(r["steps"] == 4 and math.isfinite(r["step_seconds"]) for r in rows)
    diagnosed, fallback = rows[-2:]
    assert diagnosed["float32_layers"] == []  # ViT's position embeddings make no token flat
    assert fallback["fallback_applied"] == []
    assert "## vit (4 steps a run)" in report.markdown(
        {
            "runs": rows,
            "command": "c",
            "date": "d",
            "seconds": 1.0,
            "environment": "e",
            "provenance": "p",
        }
    )


def test_a_run_of_one_model_keeps_the_other_models_runs_and_says_from_which_command(tmp_path):
    path = tmp_path / "flat_regions.json"
    earlier = {
        "command": "python -m benchmarks.flat_regions --models swin vit",
        "date": "then",
        "provenance": "commit aaa",
        "runs": [_row("swin", "float32", 1, 2.0, 0), _row("vit", "float32", 1, 2.3, 0)],
    }
    path.write_text(json.dumps(earlier))
    now = {
        "command": "python -m benchmarks.flat_regions --models vit",
        "date": "now",
        "provenance": "commit bbb",
    }
    merged = command.kept_from_earlier(
        now | {"runs": [_row("vit", "float32", 1, 2.2, 0)]}, str(path), ["vit"]
    )
    assert [(r["model"], r["outcome"]) for r in merged["runs"]] == [("vit", 2.2), ("swin", 2.0)]
    swin_then = {"models": ["swin"], "seeds": [1], "command": earlier["command"], "date": "then"}
    assert merged["kept"] == [swin_then | {"code": "commit aaa"}]
    # Run swin next: the vit rows (made now) are kept, and nothing of the first file.
    path.write_text(json.dumps(merged))
    again = command.kept_from_earlier(
        {"command": "swin", "date": "later", "provenance": "commit ccc", "runs": []},
        str(path),
        ["swin"],
    )
    vit_now = {"models": ["vit"], "seeds": [1]} | {
        "command": now["command"],
        "date": "now",
        "code": "commit bbb",
    }
    assert again["kept"] == [vit_now]
    # A third model: each kept model is credited to the command that ran it.
    swin_now = [_row("swin", "float32", 1, 2.1, 0)]
    path.write_text(json.dumps(again | {"runs": swin_now + again["runs"]}))
    third = command.kept_from_earlier(
        {"command": "segformer", "date": "last", "runs": []}, str(path), ["segformer"]
    )
    assert third["kept"] == [
        vit_now,
        {
            "models": ["swin"],
            "seeds": [1],
            "command": "swin",
            "date": "later",
            "code": "commit ccc",
        },
    ]
    assert command.kept_from_earlier(now | {"runs": []}, str(tmp_path / "none"), ["vit"]) == (
        now | {"runs": []}
    )


def test_a_run_of_some_seeds_keeps_the_model_s_other_seeds_and_credits_each_to_its_run(tmp_path):
    path = tmp_path / "flat_regions.json"
    first = [_row("swin", "float32", seed, 2.0, 0) for seed in (1, 2, 3)]
    earlier = {
        "command": "python -m benchmarks.flat_regions --models swin",
        "date": "then",
        "provenance": "commit aaa",
        "runs": first + [_row("vit", "float32", 1, 2.3, 0)],
        "kept": [{"models": ["vit"], "command": "vit", "date": "before", "code": "commit 000"}],
    }
    path.write_text(json.dumps(earlier))
    now = [_row("swin", "float32", seed, 2.1, 0) for seed in (3, 4)]
    merged = command.kept_from_earlier(
        {"command": "--seeds 3 4", "date": "now", "runs": now}, str(path), ["swin"], [3, 4]
    )
    assert sorted((r["seed"], r["outcome"]) for r in merged["runs"] if r["model"] == "swin") == [
        (1, 2.0),
        (2, 2.0),
        (3, 2.1),
        (4, 2.1),
    ]
    assert merged["kept"] == [
        {"models": ["vit"], "seeds": [1], "command": "vit", "date": "before", "code": "commit 000"},
        {"models": ["swin"], "seeds": [1, 2]}
        | {k: earlier[k] for k in ("command", "date")}
        | {"code": "commit aaa"},
    ]
    assert "- Runs of swin (seeds 1, 2) kept from `python -m benchmarks.flat_regions --models" in (
        report.markdown(merged | {"seconds": 1, "environment": "e", "provenance": "p"})
    )


def test_a_seed_outside_the_model_s_plan_is_refused_before_any_training(capsys):
    with pytest.raises(SystemExit):
        command.main(["--models", "vit", "--seeds", "9", "--out", "/nonexistent"])
    assert "--seeds [9] are not in vit's plan (1, 2, 3, 4, 5)" in capsys.readouterr().err


def test_the_recorded_command_leaves_out_where_the_results_were_written():
    assert command.recorded_command(["--models", "swin", "--out", "/tmp/x"]) == (
        "python -m benchmarks.flat_regions --models swin"
    )
    assert command.recorded_command(["--out=/tmp/x", "--quick"]) == (
        "python -m benchmarks.flat_regions --quick"
    )
