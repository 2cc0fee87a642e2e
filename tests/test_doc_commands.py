"""Every command and repository path the documentation names exists today.

A reader copies `python -m benchmarks.suite --render` or opens
`benchmarks/suite/cost.py` because a page told them to: the module has to
resolve (with the repository root on the path, as the pages assume) and the
file has to be there. The pages: README.md, docs/**/*.md, benchmarks/README.md
and the results in benchmarks/results/*.md (RESULTS.md included: it is
assembled from the others and from `benchmarks/suite/results_md.py`).
"""

from __future__ import annotations

import importlib.util
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
PAGES = sorted(
    {
        ROOT / "README.md",
        *(ROOT / "docs").rglob("*.md"),
        ROOT / "benchmarks" / "README.md",
        *(ROOT / "benchmarks" / "results").glob("*.md"),
    }
    - set((ROOT / "docs" / "_build").rglob("*.md"))
)

# `python -m name`: a placeholder (`benchmarks.<study>`) ends in a dot and is no module.
PYTHON_M = re.compile(r"python3? -m ([A-Za-z_][\w.]*)")
# Backticked text, or a link's target, that looks like a repository path: no space,
# and either a file extension or a first folder of the repository.
BACKTICKS = re.compile(r"`([^`\s]+)`")
LINK = re.compile(r"\]\((?!https?:|#|mailto:)([^)#\s]+)(?:#[^)]*)?\)")
EXTENSION = re.compile(r"\.(py|md|json|png|sh|toml|cfg|txt|rst|keras|in)$")
TOP_LEVEL = {p.name for p in ROOT.iterdir() if not p.name.startswith(".")}
# What commands write and git ignores or never holds (`--quick` runs, the built docs).
NOT_IN_THE_REPOSITORY = ("docs/_build", "benchmarks/results/quick", "results/quick", ".venv", "~")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", flags=re.S | re.M)


def modules(text: str) -> list[str]:
    """The modules that `python -m` runs in `text`, placeholders left out."""
    return sorted({m for m in PYTHON_M.findall(text) if not m.endswith(".")})


def looks_like_a_path(token: str) -> bool:
    token = token.rstrip(".,:;")
    if "://" in token or token.startswith(NOT_IN_THE_REPOSITORY) or "<" in token:
        return False
    in_a_folder, under_the_root = "/" in token, token.split("/")[0] in TOP_LEVEL
    if EXTENSION.search(token):
        return in_a_folder or under_the_root
    return in_a_folder and under_the_root


def paths(text: str) -> list[str]:
    """The repository paths named in backticks, linked to, or written in a code
    block (`bash scripts/demo.sh`) in `text`."""
    named = [t.rstrip(".,:;") for t in BACKTICKS.findall(text) if looks_like_a_path(t)]
    in_code = [
        token.rstrip(".,:;")
        for block in FENCED.findall(text)
        for token in re.findall(r"[\w./*-]+", block)
        if "/" in token and token.split("/")[0] in TOP_LEVEL and looks_like_a_path(token)
    ]
    return sorted(set(named) | set(in_code) | set(LINK.findall(text)))


def exists(page: pathlib.Path, path: str) -> bool:
    """Whether `path` names a file or folder, from the repository root or from
    the page's own folder (a link's way); `*` globs must match something."""
    for base in (ROOT, page.parent):
        if "*" in path:
            if any(base.glob(path)):
                return True
        elif (base / path).exists():
            return True
    return False


def test_the_scanners_find_modules_and_paths_and_spare_the_rest():
    text = (
        "Run `python -m benchmarks.suite --render` or `python -m benchmarks.<study>`; see "
        "`benchmarks/suite/cost.py`, [the guide](docs/guide/compile.md), `keras_als/*.py`, "
        "the layer `transformer_layer_0/self_attention/query`, `docs/_build/html`, "
        "`model.fit`, `1e-5`, `benchmarks/results/quick/`.\n"
        "```bash\nbash scripts/demo.sh  # x/y\n```\n"
    )
    assert modules(text) == ["benchmarks.suite"]
    assert paths(text) == [
        "benchmarks/suite/cost.py",
        "docs/guide/compile.md",
        "keras_als/*.py",
        "scripts/demo.sh",
    ]


def test_the_checks_fail_on_a_module_and_a_path_that_do_not_exist():
    page = ROOT / "README.md"
    assert not exists(page, "benchmarks/loss_span.py")
    assert exists(page, "benchmarks/loss_span/command.py")
    sys.path.insert(0, str(ROOT))
    try:
        assert importlib.util.find_spec("benchmarks.run") is None
        assert importlib.util.find_spec("benchmarks.suite") is not None
    finally:
        sys.path.remove(str(ROOT))


def test_the_pages_are_found():
    names = {p.relative_to(ROOT).as_posix() for p in PAGES}
    assert {"README.md", "benchmarks/README.md", "benchmarks/results/RESULTS.md"} <= names
    assert any(name.startswith("docs/guide/") for name in names)


def _resolves(module: str) -> bool:
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package that does not exist
        return False
    finally:
        sys.path.remove(str(ROOT))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_m_command_of_the_page_runs_a_module_that_exists(page):
    missing = [m for m in modules(page.read_text()) if not _resolves(m)]
    assert missing == [], f"{page.relative_to(ROOT)} runs modules that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_of_the_page_exists(page):
    missing = [p for p in paths(page.read_text()) if not exists(page, p)]
    assert missing == [], f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"
