"""The README's Python examples run as written."""

import pathlib
import re

import pytest

README = pathlib.Path(__file__).parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_quickstart_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index, capsys):
    exec(compile(BLOCKS[index], f"README.md block {index}", "exec"), {})
    assert "loss" in capsys.readouterr().out


def _cost_section() -> str:
    text = README.read_text()
    return text.split("## What it costs", 1)[1].split("\n## ", 1)[0]


def _measured_ratios() -> set[str]:
    """Every ratio over Keras of the cost study (keras_als's and its ablations'),
    and its targets, to two decimals."""
    import json

    from benchmarks.cost_at_size import plan, report

    path = README.parent / "benchmarks" / "results" / "cost_at_size.json"
    rows = json.loads(path.read_text())["rows"]
    measured = {
        f"{pair[0]:.2f}"
        for row in rows
        for method in row["step"]
        if method != "keras"
        for pair in report.ratios(row, method).values()
    }
    return measured | {f"{target:.2f}" for target in plan.TARGETS.values()}


def _unmeasured(section: str) -> list[str]:
    """The ratios (`1.26x`) quoted in `section` that the cost study did not measure."""
    quoted = re.findall(r"(\d+\.\d+)x", section)
    assert quoted, "the cost section quotes no ratio"
    return sorted(set(quoted) - _measured_ratios())


def test_every_ratio_in_the_readme_cost_section_is_one_the_cost_study_measured():
    unmeasured = _unmeasured(_cost_section())
    assert not unmeasured, (
        f"README.md's 'What it costs' quotes {unmeasured}, which "
        "benchmarks/results/cost_at_size.json does not hold: re-render the numbers from it "
        "(python -m benchmarks.cost_at_size)"
    )


def test_the_cost_check_names_a_ratio_the_study_did_not_measure():
    measured = sorted(_measured_ratios())[0]
    assert _unmeasured(f"a step takes {measured}x, the first 9.99x") == ["9.99"]


def _first_step_range() -> tuple[str, str]:
    """The smallest and largest first-step ratio of the cost study, as `0.78x`."""
    import json

    from benchmarks.cost_at_size import report

    path = README.parent / "benchmarks" / "results" / "cost_at_size.json"
    rows = json.loads(path.read_text())["rows"]
    found = [report.ratios(row).get("first_step") for row in rows]
    measured = [pair[0] for pair in found if pair is not None]
    return f"{min(measured):.2f}x", f"{max(measured):.2f}x"


@pytest.mark.parametrize(
    "page", ["README.md", "docs/guide/do_i_need_it.md", "docs/guide/limitations.md"]
)
def test_every_page_gives_the_first_step_range_the_cost_study_measured(page):
    text = (README.parent / page).read_text()
    low, high = _first_step_range()
    assert low in text and high in text, (
        f"{page} should give the first step's cost as the cost study measured it, "
        f"{low} to {high} (benchmarks/results/cost_at_size.json)"
    )


NUMBER = r"(?<![\w.^*])\d[\d,]*(?:\.\d+)?(?:e[-+]\d+)?"


def _unprinted(section: str, results: str) -> list[str]:
    """The numbers of `section` that no number of `results` gives to their precision
    (`0.160` is `-0.1596`'s magnitude; `42.8%` is 0.428 or 42.8)."""
    printed = [float(n.replace(",", "")) for n in re.findall(NUMBER, results)]

    def found(text: str) -> bool:
        value = float(text.replace(",", ""))
        half = 0.5 * 10 ** -(len(text.split(".")[1]) if "." in text else 0) + 1e-9
        return any(abs(p - value) <= half or abs(100 * p - value) <= half for p in printed)

    return [n for n in re.findall(NUMBER, section) if not found(n)]


def test_every_number_of_the_readme_results_is_one_results_md_prints():
    section = README.read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    results = (README.parent / "benchmarks" / "results" / "RESULTS.md").read_text()
    assert _unprinted(section, results) == [], "README numbers RESULTS.md does not print"


def test_the_results_check_names_a_number_results_md_does_not_print():
    assert _unprinted("a paired 0.160 ± 0.063 and 42.8%", "-0.1596 ± 0.0625, 0.428") == []
    assert _unprinted("a paired 0.160 ± 0.064", "-0.1596 ± 0.0625") == ["0.064"]
