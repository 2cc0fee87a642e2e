"""Every public name carries a docstring with a runnable (`>>>`) example.

The examples themselves run as doctests (`--doctest-modules` in setup.cfg).
The code of the user guide (its ```python blocks; `{code-block}` fragments are
not run) runs page by page in fresh processes, in the slow tests at the end.
"""

from __future__ import annotations

import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

import keras_als
from keras_als import policies


def public_policy_names() -> list[str]:
    """Public classes and functions defined in keras_als.policies."""
    return sorted(
        name
        for name, value in vars(policies).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and getattr(value, "__module__", None) == policies.__name__
    )


def test_the_public_surface_is_not_empty():
    assert "AdaptiveLossScaleOptimizer" in keras_als.__all__
    assert {"MaxSafe", "ApproxRange", "Fixed"} <= set(public_policy_names())


@pytest.mark.parametrize("name", sorted(keras_als.__all__))
def test_every_public_name_has_a_docstring_with_an_example(name):
    doc = inspect.getdoc(getattr(keras_als, name)) or ""
    assert doc, f"keras_als.{name} has no docstring"
    assert ">>>" in doc, f"keras_als.{name}'s docstring has no >>> example"


@pytest.mark.parametrize("name", public_policy_names())
def test_every_public_policy_name_has_a_docstring_with_an_example(name):
    doc = inspect.getdoc(getattr(policies, name)) or ""
    assert doc, f"keras_als.policies.{name} has no docstring"
    assert ">>>" in doc, f"keras_als.policies.{name}'s docstring has no >>> example"


ROOT = pathlib.Path(__file__).parent.parent
PAGES = sorted((ROOT / "docs").rglob("*.md"))


def python_blocks(page: pathlib.Path) -> list[str]:
    """The ```python blocks of a Markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def test_the_guide_has_runnable_code():
    assert PAGES and sum(len(python_blocks(p)) for p in PAGES) >= 6


@pytest.mark.slow
@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if python_blocks(p)],
    ids=lambda p: str(p.relative_to(ROOT / "docs")),
)
def test_guide_page_code_runs(page, tmp_path):
    code = "\n".join(python_blocks(page))
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]


# The README and the guide are user documentation: what keras_als does today.
# Which commit moved a number belongs in commit messages and RESULTS.md.
USER_DOCUMENTS = [
    ROOT / "README.md",
    ROOT / "docs" / "index.md",
    *sorted(ROOT.glob("docs/guide/*.md")),
]
README_MOST_LINES = 230
# A hex token of 7 to 40 digits with a letter and a digit in it: an abbreviated
# or full commit hash (`e83033e`, `7dde9a7`), not a word (`deadline`) or a number.
COMMIT_HASH = re.compile(r"(?<![\w-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
RELATIVE_LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)(?:#[^)]*)?\)")


def commit_hashes(text: str) -> list[str]:
    """The tokens of `text` that look like commit hashes."""
    return COMMIT_HASH.findall(text)


def test_the_commit_hash_pattern_finds_hashes_and_spares_words_and_numbers():
    assert commit_hashes("at e83033e, then 7dde9a7 and 0123456789abcdef0123") == [
        "e83033e",
        "7dde9a7",
        "0123456789abcdef0123",
    ]
    spared = "deadline, decade, 1234567, 2**15, 1e-5, float16, 64x16x64, sha256, keras-3b4c5d6e"
    assert commit_hashes(spared) == []


@pytest.mark.parametrize("page", USER_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_documentation_names_no_commit(page):
    text = page.read_text()
    assert commit_hashes(text) == [], f"{page.name}: commit hashes are history, not documentation"
    assert not re.search(r"\bcommit\b", text, flags=re.I), f"{page.name} tells a commit's story"


# A lab notebook's wording: who won (`a result against us`), which issue asked,
# step times to the tenth of a millisecond of one machine, how many runs a
# number took and which attempt was corrected, what one machine showed.
NOTEBOOK = re.compile(
    r"against us|\bissues? \d+|\d+\.\d+ ?ms\b"
    r"|\b(?:in|over|across) (?:two|three|four|five|\d+) runs\b|\bruns that split\b"
    r"|\b(?:first|second|earlier) attempt\b|\bcorrected\b|\bthis machine\b",
    flags=re.I,
)


def test_the_notebook_pattern_finds_notebook_wording_and_spares_the_rest():
    assert NOTEBOOK.findall("a result against us (issue 66), 22.3 ms a step") == [
        "against us",
        "issue 66",
        "22.3 ms",
    ]
    notebook = (
        "6.38ms, in three runs that split it; the first attempt, corrected later, on this machine"
    )
    assert NOTEBOOK.findall(notebook) == [
        "6.38ms",
        "in three runs",
        "first attempt",
        "corrected",
        "this machine",
    ]
    assert NOTEBOOK.findall("a step takes 1.26x Keras's, about 120 ms; see the issues") == []
    assert NOTEBOOK.findall("runs in fresh processes; 5 seeds; two runs of fit") == []


@pytest.mark.parametrize("page", USER_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_documentation_reads_as_documentation_not_a_lab_notebook(page):
    assert NOTEBOOK.findall(page.read_text()) == [], page.name


def test_the_readme_stays_one_page_of_documentation():
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= README_MOST_LINES, f"README.md has {lines} lines (at most {README_MOST_LINES})"


@pytest.mark.parametrize("page", USER_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_of_the_documentation_leads_to_a_file(page):
    missing = [
        link
        for link in RELATIVE_LINK.findall(page.read_text())
        if not (page.parent / link).exists()
    ]
    assert missing == [], f"{page.name} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", USER_DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_user_snippets_do_not_end_in_test_clean_up(page):
    """A reader copies a snippet whole: resetting the dtype policy at its end is
    the test suite's business (`tests/conftest.py` does it), not the reader's."""
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)
    for block in blocks:
        last = block.strip().splitlines()[-1]
        assert not re.search(r"set_(dtype|global)_policy\(\s*[\"']float32", last), block
