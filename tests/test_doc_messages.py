"""What the guide quotes keras_als as saying is what keras_als says.

A ```text block of the guide that starts with `UserWarning: keras_als:` or
`keras_als.diagnose:` quotes a warning or a printed diagnosis. Each must be,
line breaks aside, the message the code renders for the values the page
shows: the test renders them here from `keras_als.telemetry._mistakes`,
`keras_als.telemetry._telemetry` and `keras_als.float32.diagnosis`, so a message reworded in
the code fails here until the page quotes it again.
"""

from __future__ import annotations

import pathlib
import re
import types
import warnings

import pytest

from keras_als.float32.diagnosis import Diagnosis, Finding
from keras_als.telemetry import _mistakes, _telemetry

ROOT = pathlib.Path(__file__).parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
QUOTE = re.compile(
    r"^```text\n((?:UserWarning: keras_als:|keras_als\.diagnose:).*?)^```", re.S | re.M
)


def flat(text: str) -> str:
    """`text` with its line breaks and runs of spaces as single spaces."""
    return " ".join(text.split())


def warning_of(warn, telemetry: dict) -> str:
    """The one `UserWarning` that `warn` (a `_mistakes.warn_*`) gives for `telemetry`."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn(types.SimpleNamespace(), telemetry)
    (warning,) = caught
    return f"UserWarning: {warning.message}"


def rendered() -> list[str]:
    """The messages the guide quotes, rendered by the code for the guide's values."""
    patch = {
        "needs_float32": ["patch"],
        "warning": None,
        "scale": {"loss": 2.0**-10, "patch": 2.0**-24},
        "overflows": {"loss": 0, "patch": 12},
        "underflow_rate": {"loss": 0.0, "patch": 1.0},
    }
    all_skipped = {
        "skipped_in_a_row": 32,
        "recent_skip_rate": 1.0,
        "steps": 32,
        "scale": {"loss": 1.0, "wide": 1.0},
        "last_overflow_step": {"loss": -1, "wide": -1},
        "beyond_float16": [],
        "loss_not_finite": 32,
    }
    stuck = _telemetry.stuck(all_skipped, in_a_row_limit=20)
    recovered = {
        "warning": None,
        "needs_float32": [],
        "beyond_float16": ["hidden"],
        "overflows": {"loss": 0, "hidden": 5},
    }
    return [
        warning_of(_mistakes.warn_needs_float32, patch),
        f"UserWarning: {stuck}",
        warning_of(_mistakes.warn_beyond_float16, recovered),
        str(Diagnosis((Finding("wide", "forward"),))),
    ]


def quotes() -> list[tuple[pathlib.Path, str]]:
    return [(page, quote) for page in PAGES for quote in QUOTE.findall(page.read_text())]


def test_the_guide_quotes_the_float32_warnings():
    quoted = {page.name for page, _ in quotes()}
    assert "float32_tools.md" in quoted


def test_a_quote_that_differs_from_the_code_by_a_word_fails():
    messages = {flat(m) for m in rendered()}
    needs = rendered()[0]
    assert flat(needs) in messages
    assert flat(needs.replace("To fix it,", "Fix:")) not in messages


@pytest.mark.parametrize(
    "page, quote",
    quotes(),
    ids=lambda value: value.name if isinstance(value, pathlib.Path) else value[:40],
)
def test_each_quoted_message_is_what_the_code_says(page, quote):
    assert flat(quote) in {flat(m) for m in rendered()}, (
        f"{page.name} quotes a message that keras_als does not give:\n{quote}\n"
        "What the code says:\n\n" + "\n\n".join(rendered())
    )
