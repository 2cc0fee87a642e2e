"""keras_als's version: the installed distribution's, or its source tree's."""

from __future__ import annotations

import importlib.metadata
import pathlib
import tomllib

_PYPROJECT = pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml"


def version() -> str:
    """The version of the keras_als that is imported.

    Imported from a source tree (a checkout, installed editable or not), it is
    that tree's `pyproject.toml` version: the metadata of a keras_als installed
    elsewhere, or of an editable install made before the version changed, would
    name another one. Otherwise it is the installed distribution's (a wheel has
    no `pyproject.toml`); "unknown" when neither is there.

    Example:

    >>> import keras_als
    >>> keras_als.__version__.count(".") >= 2
    True
    """
    if _PYPROJECT.is_file():
        with _PYPROJECT.open("rb") as file:
            project = tomllib.load(file).get("project", {})
        if project.get("name") == "keras-als":
            return project["version"]
    try:
        return importlib.metadata.version("keras-als")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
