"""What pip and a package index see: the version, the supported range, the licence,
the classifiers, the extras."""

import importlib.metadata
import pathlib
import re
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import keras_als
from keras_als import _version

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYPROJECT = (ROOT / "pyproject.toml").read_text()
PROJECT = tomllib.loads(PYPROJECT)["project"]


def requirement(name: str) -> Requirement:
    (found,) = [r for r in map(Requirement, PROJECT["dependencies"]) if r.name == name]
    return found


def bound(name: str, operator: str) -> Version:
    (found,) = [Version(s.version) for s in requirement(name).specifier if s.operator == operator]
    return found


def oldest_pin(name: str) -> Version:
    lines = (ROOT / "scripts" / "oldest.txt").read_text().splitlines()
    (pinned,) = [Version(line.split("==")[1]) for line in lines if line.startswith(f"{name}==")]
    return pinned


def newest_tested(name: str, comment: str = PYPROJECT) -> Version:
    """The newest release pyproject.toml's comment says the whole suite ran on."""
    match = re.search(r"Newest: TensorFlow (\d+\.\d+) with[\s#]+Keras (\d+\.\d+)", comment)
    assert match, "pyproject.toml's comment no longer says 'Newest: TensorFlow X.Y with Keras X.Y'"
    return Version(match[1] if name == "tensorflow" else match[2])


def next_minor(version: Version) -> Version:
    return Version(f"{version.major}.{version.minor + 1}")


def test_the_version_is_pyproject_s():
    assert keras_als.__version__ == PROJECT["version"]
    assert str(Version(keras_als.__version__)) == PROJECT["version"]  # PEP 440, normalized


def test_an_installed_wheel_reads_its_version_from_the_package_metadata(monkeypatch, tmp_path):
    monkeypatch.setattr(_version, "_PYPROJECT", tmp_path / "pyproject.toml")  # no source tree
    monkeypatch.setattr(importlib.metadata, "version", {"keras-als": "9.8.7"}.__getitem__)
    assert _version.version() == "9.8.7"


def test_without_metadata_or_source_tree_the_version_is_unknown(monkeypatch, tmp_path):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_version, "_PYPROJECT", tmp_path / "pyproject.toml")
    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert _version.version() == "unknown"


@pytest.mark.parametrize("name", ["tensorflow", "keras"])
def test_the_oldest_pins_are_pyproject_s_lower_bounds(name):
    """scripts/oldest.txt, which CI tests, pins the oldest release pyproject allows."""
    pinned, lower = oldest_pin(name), bound(name, ">=")
    assert pinned in requirement(name).specifier
    assert pinned.release[:2] == lower.release[:2] and pinned.micro == 0


@pytest.mark.parametrize("name", ["tensorflow", "keras"])
def test_the_upper_bounds_let_in_the_newest_tested_minor_release_and_no_later_one(name):
    newest, specifier = newest_tested(name), requirement(name).specifier
    assert bound(name, "<") == next_minor(newest), f"{name}: tested up to {newest}"
    assert f"{newest}.9" in specifier  # its patch releases
    assert f"{next_minor(newest)}.0" not in specifier
    assert not specifier.contains(f"{next_minor(newest)}.0rc1", prereleases=True)


def test_the_newest_tested_release_is_read_from_the_comment():
    comment = "# Newest: TensorFlow 2.30 with\n# Keras 3.40 (.venv)"
    assert newest_tested("tensorflow", comment) == Version("2.30")
    assert newest_tested("keras", comment) == Version("3.40")
    assert next_minor(Version("3.15")) == Version("3.16")


@pytest.mark.parametrize("name", ["tensorflow", "keras"])
def test_the_installed_release_is_the_newest_pyproject_says_was_tested(name):
    """Raising an upper bound without upgrading .venv (pip keeps what satisfies the
    new range) would claim a release the suite never ran on."""
    installed = Version(importlib.metadata.version(name))
    if installed == oldest_pin(name):
        pytest.skip("the oldest-pins venv (scripts/oldest.txt) tests the lower bounds")
    assert installed in requirement(name).specifier
    assert installed.release[:2] == newest_tested(name).release[:2], (
        f"{name} {installed} is installed; pyproject.toml says {newest_tested(name)} was tested"
    )


@pytest.mark.parametrize("page", ["README.md", "docs/index.md", "docs/pypi.md"])
def test_the_documentation_states_the_accepted_range(page):
    tf, keras = (f"{bound(n, '>=')}-{newest_tested(n)}" for n in ("tensorflow", "keras"))
    text = " ".join((ROOT / page).read_text().split())
    assert f"TensorFlow {tf} with Keras {keras}" in text


def test_the_licence_file_is_the_apache_license_pyproject_declares():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190


def test_the_classifiers_say_what_keras_als_is_and_are_valid_with_the_spdx_licence():
    classifiers = PROJECT.get("classifiers", [])
    for wanted in [
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
        "Typing :: Typed",
    ]:
        assert wanted in classifiers
    # setuptools>=77 refuses a licence classifier beside the SPDX `license` field.
    assert not [c for c in classifiers if c.startswith("License ::")]
    assert len(set(classifiers)) == len(classifiers)


def test_the_python_classifiers_are_requires_python_s_versions():
    supported = SpecifierSet(PROJECT["requires-python"])
    minors = [f"3.{minor}" for minor in range(30) if f"3.{minor}.0" in supported]
    listed = [
        c.rsplit(" :: ", 1)[1]
        for c in PROJECT.get("classifiers", [])
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert minors and listed == minors


def test_keywords_name_what_one_would_search_for():
    keywords = [k.lower() for k in PROJECT.get("keywords", [])]
    assert {"keras", "tensorflow", "float16", "loss scaling"} <= set(keywords)


def test_the_package_is_marked_typed_and_ships_the_marker():
    """PEP 561: without py.typed in the installed package, type checkers ignore
    keras_als's annotations (and "Typing :: Typed" would be untrue)."""
    assert (ROOT / "keras_als" / "py.typed").is_file()
    setuptools = tomllib.loads(PYPROJECT)["tool"]["setuptools"]
    assert "py.typed" in setuptools.get("package-data", {}).get("keras_als", [])


USER_EXTRAS = {"plots", "demo", "docs"}
DEVELOPMENT_TOOLS = {"ruff", "build", "twine", "hypothesis"}  # and pytest*


def is_development_tool(requirement: Requirement) -> bool:
    name = requirement.name.lower().replace("_", "-")
    return name in DEVELOPMENT_TOOLS or name.startswith("pytest")


def extra(name: str) -> list[Requirement]:
    return [Requirement(line) for line in PROJECT["optional-dependencies"][name]]


def test_the_extras_are_the_user_s_three_and_dev():
    assert set(PROJECT["optional-dependencies"]) == USER_EXTRAS | {"dev"}


@pytest.mark.parametrize("name", sorted(USER_EXTRAS))
def test_a_user_facing_extra_holds_no_development_tool(name):
    assert [str(r) for r in extra(name) if is_development_tool(r)] == []


def test_the_dev_extra_holds_the_tools_the_scripts_run():
    names = {r.name for r in extra("dev")}
    assert {"pytest", "pytest-xdist", "hypothesis", "ruff", "build"} <= names
    assert all(map(is_development_tool, extra("dev")))


def test_the_development_tool_rule_tells_tools_from_libraries():
    tools = ["pytest-xdist>=3", "Ruff", "build>=1.2", "Twine"]
    assert all(is_development_tool(Requirement(r)) for r in tools)
    libraries = ["matplotlib", "sphinx", "keras_hub"]  # the demo trains a KerasHub model
    assert not any(is_development_tool(Requirement(r)) for r in libraries)


# `.[docs]`, `keras_als[plots,demo]`, `keras-als[plots]`, `$wheel[plots]`.
EXTRAS_NAMED = re.compile(r"(?:\.|keras[_-]als|\$wheel)\[([\w,-]+)\]")


def test_every_extra_the_scripts_and_documentation_install_exists():
    files = [
        ROOT / "README.md",
        ROOT / ".ci" / "run",
        *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "scripts").glob("*.sh")),
        *sorted((ROOT / "keras_als").rglob("*.py")),
    ]
    named = {
        (path.relative_to(ROOT).as_posix(), name)
        for path in files
        for names in EXTRAS_NAMED.findall(path.read_text())
        for name in names.split(",")
    }
    (setup_extras,) = re.findall(r"^extras=(\S+)$", (ROOT / "scripts/setup.sh").read_text(), re.M)
    named |= {("scripts/setup.sh", name) for name in setup_extras.split(",")}
    assert {name for _, name in named} >= {"plots", "docs", "dev"}
    assert [n for n in sorted(named) if n[1] not in PROJECT["optional-dependencies"]] == []


def package_index_page() -> pathlib.Path:
    """pyproject.toml's readme: the long description a package index shows."""
    readme = PROJECT["readme"]
    if isinstance(readme, dict):
        assert readme["content-type"] == "text/markdown"
        readme = readme["file"]
    return ROOT / readme


def relative_links(markdown: str) -> list[str]:
    """Link and image targets that are not absolute URLs (nor anchors): Markdown
    inline and reference links, HTML href and src."""
    absolute = r"(?!https?:|mailto:|#)"
    return [
        *re.findall(rf"\]\({absolute}([^)\s]*)", markdown),
        *re.findall(rf"^ {{0,3}}\[[^\]]+\]:\s*{absolute}(\S+)", markdown, flags=re.M),
        *re.findall(rf"(?:href|src)=[\"']{absolute}([^\"']*)", markdown),
    ]


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", markdown, flags=re.S | re.M)


def test_relative_links_are_found_and_absolute_ones_spared():
    text = """[guide](docs/guide/x.md) ![plot](benchmarks/results/scales.png)
[ref]: ../RESULTS.md
<img src="a.png"> <a href="b.html">b</a>
[pep](https://peps.python.org/pep-0561/) [top](#install) <a href="http://x.org">x</a>
"""
    assert relative_links(text) == [
        "docs/guide/x.md",
        "benchmarks/results/scales.png",
        "../RESULTS.md",
        "a.png",
        "b.html",
    ]
    assert relative_links((ROOT / "README.md").read_text())  # what the index page avoids


def test_the_package_index_page_has_no_relative_links():
    """A package index shows the long description away from the repository, where
    a relative link leads nowhere (README.md's do: it is not the readme)."""
    assert package_index_page().is_file()
    assert relative_links(package_index_page().read_text()) == []


def test_the_package_index_page_shows_the_readme_s_quickstart_and_nothing_else_untested():
    """Its code is the README's first block (the quickstart, which test_readme.py and
    scripts/check_wheel.sh run), so it runs as written."""
    readme, page = (
        python_blocks(p.read_text()) for p in (ROOT / "README.md", package_index_page())
    )
    assert readme and page and page[0] == readme[0]
    assert [block for block in page if block not in readme] == []
