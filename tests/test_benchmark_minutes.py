"""The minutes benchmarks/README.md gives a study are the wall time its results record.

The study table's `minutes` column says how long the default command runs. Where
the committed results record that command's wall time (`seconds`), the table's
`~N` has to be within a factor of 1.5 of it: a reader who plans an afternoon
around `~50` for a study that takes 86 minutes was told a number nothing gave.
"""

from __future__ import annotations

import json
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).parent.parent
README = ROOT / "benchmarks" / "README.md"
RESULTS = ROOT / "benchmarks" / "results"
FACTOR = 1.5

# (study folder in the table, label before `~N` in its minutes cell or "", results file).
RECORDED = [
    ("suite/", "", "results.json"),
    ("loss_span/", "", "loss_span.json"),
    ("heavy_tails/", "", "heavy_tails.json"),
    ("detection/", "", "detection.json"),
    ("keras_hub_tasks/", "retinanet", "retinanet.json"),
    ("keras_hub_tasks/", "lora", "lora.json"),
    ("profiles/", "margin_sweep", "margin_sweep.json"),
]


def minutes_cell(study: str) -> str:
    """The `minutes` cell of the study table's row for `study`."""
    for line in README.read_text().splitlines():
        if line.startswith(f"| `{study}` |"):
            return line.split(" | ")[3]
    raise AssertionError(f"benchmarks/README.md has no study row for {study}")


def stated_minutes(cell: str, label: str) -> float:
    """The `~N` of `cell`, after `label` when one is given."""
    found = re.search(rf"{re.escape(label)}\s*~(\d+(?:\.\d+)?)", cell)
    assert found, f"no ~minutes after {label!r} in {cell!r}"
    return float(found.group(1))


def recorded_minutes(name: str) -> float:
    """The wall time, in minutes, that results file `name` records for its command."""
    seconds = json.loads((RESULTS / name).read_text())["seconds"]
    return (seconds["total"] if isinstance(seconds, dict) else seconds) / 60


def test_the_minutes_parser_reads_the_cell():
    assert stated_minutes("retinanet ~87, lora ~10", "lora") == 10
    assert stated_minutes("~86", "") == 86


@pytest.mark.parametrize(("study", "label", "name"), RECORDED, ids=lambda v: str(v))
def test_the_study_table_gives_the_recorded_wall_time(study, label, name):
    stated, recorded = stated_minutes(minutes_cell(study), label), recorded_minutes(name)
    assert recorded / FACTOR <= stated <= recorded * FACTOR, (
        f"benchmarks/README.md gives {study} {label} ~{stated:g} minutes; "
        f"benchmarks/results/{name} records {recorded:.0f}"
    )
