"""Sphinx configuration for the keras_als documentation.

Build: `bash scripts/docs.sh` (HTML in docs/_build/html, warnings are errors).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.abspath(".."))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras_als  # noqa: E402

project = "keras_als"
author = "keras_als contributors"
copyright = "2026, keras_als contributors"
version = release = keras_als.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "pypi.md"]  # the package index's page, not the guide's
root_doc = "index"

# Docstrings are Google style and write code in single backticks.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields: no duplicate NamedTuple entries
default_role = "literal"
autodoc_member_order = "bysource"
# Only keras_als's own docstrings: methods inherited from Keras are not repeated.
autodoc_inherit_docstrings = False
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

html_theme = "alabaster"
html_title = f"keras_als {release}"
html_theme_options = {"description": "Adaptive loss scaling for Keras 3", "fixed_sidebar": True}


def _skip_namedtuple_fields(app, what, name, obj, skip, options):
    """Skips the "Alias for field number N" entries of NamedTuple fields."""
    if (getattr(obj, "__doc__", None) or "").startswith("Alias for field number"):
        return True
    return None


def setup(app):
    app.connect("autodoc-skip-member", _skip_namedtuple_fields)
