"""The KerasHub families sweep (`benchmarks/keras_hub_families`): its data,
its verdicts against hand-made rows, and one real tiny run."""

import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest

from benchmarks.harness import scaling
from benchmarks.keras_hub_families import batches, families, report, skips, study

RESULTS = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"


def _row(family, method, seed, outcome, skipped=0, **extra):
    return {
        "family": family,
        "method": method,
        "seed": seed,
        "outcome": outcome,
        "final_loss": outcome,
        "skipped": skipped,
        "error": None,
    } | extra


def _family(f32, fallback, keras_skips=(3, 4), fallback_skips=(0, 0), applied=None):
    rows = []
    for i, seed in enumerate((1, 2)):
        rows += [
            _row("x", "float32", seed, f32[i]),
            _row("x", "mixed_no_scaling", seed, math.nan),
            _row("x", "keras_lso", seed, f32[i] + 0.5, keras_skips[i]),
            _row("x", "als_max_safe", seed, f32[i], 1),
            _row(
                "x",
                "als_fallback",
                seed,
                fallback[i],
                fallback_skips[i],
                fallback_applied=(applied or [[], []])[i],
            ),
        ]
    return rows


def test_the_seed_noise_is_twice_the_float32_spread_with_a_two_percent_floor():
    assert report.noise([2.0, 2.1]) == pytest.approx(0.2)
    assert report.noise([2.0, 2.001]) == pytest.approx(0.02 * 2.0005)
    assert report.noise([3.0]) == pytest.approx(0.06)


def test_the_verdict_passes_within_the_noise_and_fails_beyond_it_or_on_more_skips():
    assert report.verdict(_family((2.0, 2.1), (2.2, 2.1)), "x") == "pass"  # +0.1 <= 0.2
    assert report.verdict(_family((2.0, 2.1), (1.0, 1.0)), "x") == "pass"  # lower is fine
    beyond = report.verdict(_family((2.0, 2.1), (2.4, 2.2)), "x")  # +0.25 > 0.2
    assert beyond == "fail: loss +0.25 beyond noise 0.2"
    skips = report.verdict(_family((2.0, 2.1), (2.0, 2.1), fallback_skips=(3, 5)), "x")
    assert skips == "fail: skips more than Keras's on seeds [2]"
    assert report.verdict(_family((2.0, 2.1), (math.nan, 2.1)), "x") == "fail: loss not finite"
    broken = _family((2.0, math.nan), (2.0, 2.1))
    assert report.verdict(broken, "x") == "float32 fails"
    raised = [
        dict(r, error="train block 1: ValueError") if r["method"] != "float32" else r
        for r in _family((2.0, 2.1), (2.0, 2.1))
    ]
    assert report.verdict(raised, "x") == "float16 fails"
    stopped = [dict(r, error="timed out after 600 s") for r in _family((2.0, 2.1), (2.0, 2.1))]
    assert report.verdict(stopped, "x") == "timed out"
    ours_alone = [
        dict(r, error="train block 1: ValueError") if r["method"] == "als_fallback" else r
        for r in _family((2.0, 2.1), (2.0, 2.1))
    ]
    assert report.verdict(ours_alone, "x") == "fail: keras_als + Float32Fallback raised"


def test_the_table_gives_a_line_a_family_with_skips_per_seed_and_layers_moved():
    rows = _family((2.0, 2.1), (2.0, 2.1), applied=[[[0, ["a", "b"]]], [[0, ["a"]]]])
    rows += [dict(r, family="y", error="build: ValueError: no") for r in _family((1, 1), (1, 1))]
    lines = report.table(rows, ["y", "x"])
    assert lines[2].startswith("| y | 1,2 | error |") and lines[2].endswith("| float32 fails |")
    assert lines[3] == (
        "| x | 1,2 | 2.050 | not finite (2 of 2) | 2.550, 3/4 | 2.050, 1/1 "
        "| 2.050, 0/0, 2: `a`, `b` | pass |"
    )
    assert report.counts(rows, ["x", "y"]) == {"pass": 1, "float32 fails": 1}
    assert report.errors(rows, ["x", "y"])[0] == ("- y, float32 (seeds 1,2): build: ValueError: no")


def test_the_pairs_not_run_are_grouped_by_seed():
    pairs = ["moonshine (seed 1)", "bert (seed 2)", "gpt2 (seed 2)"]
    assert report.not_run(pairs, 2) == "seed 1: moonshine; seed 2: every family"
    assert report.not_run(pairs, 3) == "seed 1: moonshine; seed 2: bert, gpt2"


def test_the_data_is_real_text_and_digits_of_the_planned_sizes():
    x, y = batches.data("text")
    assert x["token_ids"].shape == (160, 16) and set(np.unique(y)) == {0, 1}
    assert 2 <= x["token_ids"].min() and x["token_ids"].max() < batches.VOCABULARY
    x, y = batches.data("causal_lm", "test")
    np.testing.assert_array_equal(x["token_ids"][:, 1:], y[:, :-1])
    images, labels = batches.data("image")
    assert images.shape == (160, 32, 32, 3) and 0.0 <= images.min() and images.max() <= 1.0
    assert set(np.unique(labels)) == set(range(10))
    _, masks = batches.data("segmentation_one_hot", "test")
    assert masks.shape == (32, 32, 32, 11)
    np.testing.assert_array_equal(masks.sum(-1), 1.0)


@pytest.mark.slow
def test_one_tiny_family_trains_under_every_method():
    rows = study.run_seed("distil_bert", 1, blocks=1, steps_per_block=2)
    assert [r["method"] for r in rows] == [m.name for m in study.METHODS]
    assert all(r["error"] is None and math.isfinite(r["outcome"]) for r in rows)
    assert all(r["steps"] == 2 and r["skipped"] >= 0 for r in rows)
    assert isinstance(rows[-1]["fallback_applied"], list)


def test_a_later_command_keeps_the_earlier_runs_of_other_families_and_seeds(tmp_path):
    import json

    from benchmarks.keras_hub_families import command

    earlier = {
        "command": "python -m benchmarks.keras_hub_families",
        "date": "then",
        "not_run": ["whisper (seed 1)", "bert (seed 2)", "whisper (seed 2)"],
        "runs": [_row("bert", "float32", 1, 0.7), _row("whisper", "float32", 1, 9.0)],
    }
    path = tmp_path / "keras_hub_families.json"
    path.write_text(json.dumps(earlier))
    now = {
        "command": "c",
        "date": "now",
        "not_run": [],
        "runs": [_row("whisper", "float32", 1, 6.0)],
    }
    merged = command.kept_from_earlier(now, str(path))
    assert [(r["family"], r["outcome"]) for r in merged["runs"]] == [
        ("bert", 0.7),
        ("whisper", 6.0),
    ]
    assert merged["not_run"] == ["bert (seed 2)", "whisper (seed 2)"]
    assert merged["kept"] == [
        {"command": earlier["command"], "date": "then", "code": None, "runs": 1}
    ]


def test_each_kept_command_counts_the_pairs_it_measured_itself(tmp_path):
    """Three runs in turn: the third's file names the first command for the
    pair only it measured and the second for its own, with their code."""
    import json

    from benchmarks.keras_hub_families import command

    def run(name, date, code, runs):
        return {"command": name, "date": date, "provenance": code, "not_run": [], "runs": runs}

    def measured(family, seed, date):
        return _row(family, "float32", seed, 0.7) | {"measured_by": date}

    path = tmp_path / "keras_hub_families.json"
    first = run("one", "d1", "commit a", [measured("bert", 1, "d1"), measured("gpt2", 1, "d1")])
    path.write_text(json.dumps(first))
    second = command.kept_from_earlier(
        run("two", "d2", "commit b", [measured("gpt2", 1, "d2")]), str(path)
    )
    path.write_text(json.dumps(second))
    third = command.kept_from_earlier(
        run("three", "d3", "commit c", [measured("t5", 1, "d3")]), str(path)
    )
    assert third["kept"] == [
        {"command": "one", "date": "d1", "code": "commit a", "runs": 1},
        {"command": "two", "date": "d2", "code": "commit b", "runs": 1},
    ]
    text = report.markdown(third | {"seconds": 1.0, "environment": "e"}, ["bert", "gpt2", "t5"])
    assert "- Kept: 1 family-seed pairs measured by `one` (d1; keras_als commit a)" in text


def test_the_recorded_command_leaves_out_the_output_folder():
    from benchmarks.harness import provenance

    argv = ["--families", "bert", "--out", "/tmp/x", "--seeds", "1", "--out=/tmp/y"]
    assert provenance.recorded_command("benchmarks.keras_hub_families", argv) == (
        "python -m benchmarks.keras_hub_families --families bert --seeds 1"
    )


def test_every_family_that_did_not_pass_the_committed_sweep_is_explained_in_its_section():
    """RESULTS.md's sweep says why each family failed or got no verdict."""
    with open(RESULTS / "keras_hub_families.json") as f:
        results = json.load(f)
    rows = results["runs"]
    order = report.families_in(rows, list(families.FAMILIES))
    short = {name for name in order if report.verdict(rows, name).startswith(("fail", "timed out"))}
    assert short and short <= set(report.EXPLAINED), short - set(report.EXPLAINED)
    text = report.markdown(results, list(families.FAMILIES))
    for name in short:
        assert f"- **{name}**: {report.EXPLAINED[name]}" in text
    assert "- **opt**" not in text  # a family that passed is not explained


def test_the_skip_table_gives_each_skip_and_the_scales_where_it_started():
    events = [
        {
            "step": 30,
            "keras_skipped": False,
            "keras_scale": 2.0**15,
            "keras_als_skipped": True,
            "keras_als_origins": {"block/query": 2.0**17, "stream": 2.0**13},
        }
    ]
    lines = skips.table(events)
    assert lines[2] == "| 30 | False (2^15) | True | `block/query`: 2^17, `stream`: 2^13 |"
    assert skips.table([])[2].startswith("| - | no step skipped")


@pytest.mark.slow
def test_the_skip_trace_finds_a_step_keras_als_skipped_from_too_large_a_scale(monkeypatch):
    """With every scale starting at 2**40 keras_als skips its first step, where
    Keras's optimizer at 2**15 does not; the trace says so and where it started."""
    too_large = dataclasses.replace(scaling.ALS_MAX_SAFE, initial_scale=2.0**40)
    monkeypatch.setattr(skips.scaling, "ALS_MAX_SAFE", too_large)
    events = skips.trace("distil_bert", 1, steps=2)
    first = events[0]
    assert first["step"] == 0 and first["keras_als_skipped"] and not first["keras_skipped"]
    assert first["keras_scale"] == 2.0**15
    assert first["keras_als_origins"] and set(first["keras_als_origins"].values()) == {2.0**40}
