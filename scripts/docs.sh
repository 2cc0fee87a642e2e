#!/usr/bin/env bash
# Builds the documentation (Sphinx, HTML in docs/_build/html) with warnings as
# errors. Creates .venv first if needed (scripts/setup.sh) and installs the
# docs extra only when Sphinx or myst-parser is missing. Extra arguments go to
# sphinx-build (e.g. -E to rebuild every page).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=${KERAS_ALS_VENV:-.venv}
if ! "$venv/bin/python" -c 'import sphinx, myst_parser' 2>/dev/null; then
  if ! "$venv/bin/python" -m pip install -e ".[docs]" >"$venv/pip-docs.log" 2>&1; then
    cat "$venv/pip-docs.log" >&2
    echo "docs.sh: pip failed (above, and in $venv/pip-docs.log)." >&2
    exit 1
  fi
fi
TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" -m sphinx -W --keep-going -b html "$@" docs docs/_build/html
echo "docs: open docs/_build/html/index.html"
