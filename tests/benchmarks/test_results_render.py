"""The committed benchmark markdown is what the code renders from the committed JSON.

RESULTS.md and each study's table are generated, never edited by hand: rendered
again from the JSON stored beside them, each must come out byte for byte as
committed. A change to the rendering code (or a hand edit) that was not followed
by a re-render fails here. No benchmark runs: rendering is pure.
"""

import json
import pathlib

import pytest

RESULTS = pathlib.Path(__file__).parents[2] / "benchmarks" / "results"


def _json(name: str):
    return json.loads((RESULTS / name).read_text())


def _committed(name: str) -> str:
    return (RESULTS / name).read_text()


def test_results_md_renders_from_results_json_as_committed():
    from benchmarks.suite import results_md, targets

    results = results_md.load(str(RESULTS / "results.json"))
    judged = targets.judge(results)
    text = results_md.markdown(
        results,
        judged,
        results["command"],
        ["scales.png", "underflow.png"],  # what suite.plots.save_all writes
        results_md.separate_sections(str(RESULTS)),
    )
    assert text == _committed("RESULTS.md")


def _detection() -> str:
    from benchmarks.detection import plan, report

    saved = _json("detection.json")
    runs = [plan.Run(**r) for r in saved["runs"]]
    return report.markdown(runs, saved["command"], saved["seconds"], saved["settings"])


def _heavy_tails() -> str:
    from benchmarks.heavy_tails import plan, report, training

    saved = _json("heavy_tails.json")
    runs = [training.Run(**r) for r in saved["runs"]]
    settings = [plan.Setting(**s) for s in saved["settings"]]
    verdicts = [report.judge(runs, s.name) for s in settings]
    return report.markdown(dict(saved, runs=runs, settings=settings, verdicts=verdicts))


def _loss_span() -> str:
    from benchmarks.loss_span import report

    return report.markdown(_json("loss_span.json"), "loss_span.png")


def _loss_span_float16_heads() -> str:
    from benchmarks.loss_span import report, training

    runs = [training.Run(**r) for r in _json("loss_span_float16_heads.json")["runs"]]
    return report.per_output_markdown(runs)


def _hard_outcomes() -> str:
    from benchmarks.hard_outcomes import report

    return report.markdown(_json("hard_outcomes.json"))


def _real_models() -> str:
    from benchmarks.real_models import report

    return report.markdown(_json("real_models.json"))


def _keras_hub_task(name: str):
    def render() -> str:
        from benchmarks.keras_hub_tasks import report

        return report.markdown(_json(f"{name}.json"))

    return render


def _flat_regions() -> str:
    from benchmarks.flat_regions import report

    return report.markdown(_json("flat_regions.json"))


def _flat_regions_mechanism() -> str:
    from benchmarks.flat_regions import mechanism_report

    return mechanism_report.markdown(_json("flat_regions_mechanism.json"))


def _keras_hub_families() -> str:
    from benchmarks.keras_hub_families import families, report

    return report.markdown(_json("keras_hub_families.json"), list(families.FAMILIES))


def _step_profile() -> str:
    from benchmarks.profiles import step_profile

    return step_profile.markdown(_json("step_profile.json"))


def _memory_breakdown() -> str:
    from benchmarks.suite import memory

    return memory.breakdown_markdown(_json("memory_breakdown.json"))


def _step_breakdown() -> str:
    from benchmarks.suite import cost

    return cost.breakdown_markdown(_json("step_breakdown.json"))


def _cost_at_size() -> str:
    from benchmarks.cost_at_size import report

    return report.render(_json("cost_at_size.json"))


def _profile_at_size() -> str:
    from benchmarks.profiles import step_profile

    return step_profile.markdown(_json("step_profile_at_size.json"))


def _profile(name: str):
    """Renders `<name>.json` with `benchmarks.profiles.<name>.render`."""

    def render() -> str:
        import importlib

        module = importlib.import_module(f"benchmarks.profiles.{name}")
        return module.render(_json(f"{name}.json"))

    return render


@pytest.mark.parametrize(
    "name, render",
    [
        ("detection.md", _detection),
        ("heavy_tails.md", _heavy_tails),
        ("loss_span.md", _loss_span),
        ("loss_span_float16_heads.md", _loss_span_float16_heads),
        ("hard_outcomes.md", _hard_outcomes),
        ("retinanet.md", _keras_hub_task("retinanet")),
        ("lora.md", _keras_hub_task("lora")),
        ("flat_regions.md", _flat_regions),
        ("flat_regions_mechanism.md", _flat_regions_mechanism),
        ("keras_hub_families.md", _keras_hub_families),
        ("real_models.md", _real_models),
        ("step_profile.md", _step_profile),
        ("memory_breakdown.md", _memory_breakdown),
        ("step_breakdown.md", _step_breakdown),
        ("cost_at_size.md", _cost_at_size),
        ("first_step.md", _profile("first_step")),
        ("step_profile_at_size.md", _profile_at_size),
        ("margin_sweep.md", _profile("margin_sweep")),
        ("monitor_cost.md", _profile("monitor_cost")),
        ("step_program.md", _profile("step_program")),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_each_study_table_renders_from_its_json_as_committed(name, render):
    assert render() == _committed(name)
