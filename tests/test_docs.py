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
