"""What pip sees: the version, the supported range, the licence."""

import importlib.metadata
import pathlib
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import keras_als
from keras_als import _version

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


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
    requirements = [Requirement(line) for line in PROJECT["dependencies"]]
    (requirement,) = [r for r in requirements if r.name == name]
    lines = (ROOT / "scripts" / "oldest.txt").read_text().splitlines()
    (pinned,) = [Version(line.split("==")[1]) for line in lines if line.startswith(f"{name}==")]
    (lower,) = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
    assert pinned in requirement.specifier
    assert pinned.release[:2] == lower.release[:2] and pinned.micro == 0


def test_the_licence_file_is_the_apache_license_pyproject_declares():
    assert PROJECT["license"] == "Apache-2.0"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 190
