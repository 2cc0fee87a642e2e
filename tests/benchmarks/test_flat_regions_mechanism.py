"""The flat-regions mechanism: per-layer float32 ranges and lost shares, against closed forms."""

import dataclasses

import numpy as np
import pytest

from benchmarks.flat_regions import mechanism, mechanism_report, plan


def test_a_layer_s_range_gives_its_extremes_and_the_shares_beyond_float16_at_scale_1():
    kernel = np.array([[1e5, -3.0], [0.0, 2.0**-26]], np.float32)
    bias = np.array([-7e4, 0.5], np.float32)
    r = mechanism.gradient_range([kernel, bias])
    assert r["largest"] == pytest.approx(1e5) and r["smallest"] == pytest.approx(2.0**-26)
    # five values are not zero: two above 65504, one below 2**-24
    assert r["above"] == pytest.approx(2 / 5) and r["below"] == pytest.approx(1 / 5)
    assert mechanism.gradient_range([np.zeros(3, np.float32)])["largest"] == 0.0


def test_a_value_is_lost_where_float32_s_is_not_zero_and_the_method_s_is_zero_or_not_finite():
    reference = [np.array([1.0, 2.0, 0.0, 3.0]), np.array([4.0])]
    measured = [np.array([1.0, 0.0, 0.0, np.inf]), np.array([np.nan])]
    assert mechanism.lost_share(reference, measured) == pytest.approx(3 / 4)
    assert mechanism.lost_share([np.zeros(2)], [np.zeros(2)]) == 0.0


def test_variables_group_by_their_layer_s_path_in_order():
    paths = ["m/patch/conv/kernel", "m/patch/conv/bias", "m/norm/gamma", "head/kernel"]
    assert mechanism.by_layer(paths) == {"m/patch/conv": [0, 1], "m/norm": [2], "head": [3]}


def _results():
    layers = {
        "patch/conv": {"largest": 8.8e14, "smallest": 1e-3, "above": 0.5, "below": 0.0},
        "block/dense": {"largest": 1.0, "smallest": 1e-4, "above": 0.0, "below": 0.0},
        "head": {"largest": 1.0, "smallest": 1e-4, "above": 0.0, "below": 0.0},
    }

    def method(lost, scales, layers_in_float32=()):
        return {
            "lost": dict(zip(layers, lost)),
            "lost_overall": max(lost),
            "finite": max(lost) < 1,
            "scales": scales,
            "skipped_while_training": 3,
            "float32_layers": list(layers_in_float32),
        }

    methods = {
        "keras_lso": method([1.0, 0.2, 0.001], [2.0**-15]),
        "als_max_safe": method([1.0, 1.0, 0.0], [2.0**-24, 2.0**10]),
        "als_diagnosed": method([0.0, 0.0, 0.0], [2.0**4, 2.0**9], ["patch/conv"]),
    }
    phases = {p: {"layers": layers, "methods": methods} for p in ("start", "later")}
    return {"models": [{"model": "swin", "later_steps": 7, "phases": phases}]}


def test_the_table_lists_layers_beyond_float16_or_lost_and_counts_the_others():
    lines = mechanism_report.phase_table(_results()["models"][0], "start")
    assert lines[0].count("lost:") == 3
    rows = [line for line in lines[2:] if line.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows] == ["| patch/conv", "| block/dense"]
    assert "| 8.80e+14 | 1.00e-03 | 60 | 50.00% / 0.00% | 100.0% | 100.0% | 0.0% |" in rows[0]
    assert any(line.startswith("\n1 other layers") for line in lines)
    assert any("scales 2^-24 to 2^10," in line for line in lines)
    assert any("scale 2^-15," in line and "not finite" in line for line in lines)
    assert any("float32 layers: patch/conv" in line for line in lines)


def test_the_markdown_has_both_phases_of_every_model():
    text = mechanism_report.markdown(
        _results() | {"command": "c", "date": "d", "environment": "e", "provenance": "p"}
    )
    assert "## swin, start (initial weights)" in text
    assert "## swin, later (float32's weights after 7 steps)" in text


def test_each_model_says_the_code_it_was_measured_on_or_that_it_is_unknown():
    results = _results() | {"command": "c", "date": "d", "environment": "e", "provenance": "p"}
    swin = results["models"][0]
    older = swin | {"model": "vit"}  # kept from a run before models carried provenance
    swin = swin | {"date": "2026-12-03 19:00 UTC", "code": "commit abc1234, clean"}
    text = mechanism_report.markdown(results | {"models": [swin, older]})
    assert "Measured 2026-12-03 19:00 UTC; keras_als commit abc1234, clean." in text
    assert text.count("Measured ") == 2  # once per model, under its first phase
    assert "Measured in an earlier run of this command, on keras_als code it did not" in text


@pytest.mark.slow
def test_the_mechanism_runs_on_the_vit_and_finds_float16_enough_there(tmp_path, monkeypatch):
    # Without XLA: compiling each arm's steps would take most of the test's time
    # (the study runs with XLA; test_calibration.py and test_diagnosis.py train Swin with it).
    vit = dataclasses.replace(plan.MODELS["vit"], jit_compile=False)
    monkeypatch.setitem(plan.MODELS, "vit", vit)
    assert mechanism.main(["--quick", "--models", "vit", "--out", str(tmp_path)]) == 0
    import json

    (model,) = json.loads((tmp_path / "flat_regions_mechanism.json").read_text())["models"]
    for phase in ("start", "later"):
        found = model["phases"][phase]
        assert set(found["methods"]) == {m.name for m in mechanism.MIXED}
        assert all(r["above"] == 0 for r in found["layers"].values())  # nothing beyond 65504
        ours = found["methods"]["als_max_safe"]
        assert ours["finite"] and ours["lost_overall"] < 0.01, ours
    assert (tmp_path / "flat_regions_mechanism.md").read_text().count("## vit") == 2
    assert model["code"].startswith("commit ") and "sha256 of keras_als" in model["code"]
