#!/usr/bin/env bash
# Creates a virtualenv (.venv) and installs keras_als with its dev (the tests'
# and the build's tools), plots and demo extras. Idempotent: does nothing when
# the venv is up to date, re-installs when pyproject.toml or the extras changed,
# and re-creates the venv when its Python is not the one chosen below.
#
# Python: the newest of python3.13, python3.12, python3.11, python3, python on
# PATH that runs and lies in pyproject.toml's requires-python (the CPython
# versions TensorFlow 2.20 and 2.21 have wheels for, from 3.11 on).
#   KERAS_ALS_PYTHON=python3.12   use this Python (a command or a path)
#   KERAS_ALS_VENV=.venv-3.12     put the venv here instead of .venv
#   KERAS_ALS_OLDEST=1            install the oldest TensorFlow and Keras keras_als
#                                 supports (scripts/oldest.txt; Python 3.12 at most)
#   bash scripts/setup.sh --which prints the Python it would use, and stops
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${KERAS_ALS_VENV:-.venv}

# requires-python = ">=3.A,<3.B" in pyproject.toml: the one place the range is set.
range=$(sed -n 's/^requires-python = ">=3\.\([0-9]*\),<3\.\([0-9]*\)".*$/\1 \2/p' pyproject.toml)
if [ -z "$range" ]; then
  echo "setup.sh: pyproject.toml's requires-python is not of the form \">=3.A,<3.B\"." >&2
  exit 1
fi
read -r low high <<<"$range"
oldest=${KERAS_ALS_OLDEST:-0}
if [ "$oldest" = 1 ] && [ "$high" -gt 13 ]; then
  high=13  # TensorFlow 2.19 has no wheels for Python 3.13
fi
supported="3.$low to 3.$((high - 1))"

# Prints the absolute path of a supported Python run as "$1", or nothing.
# Asked for by name (KERAS_ALS_PYTHON), a pyenv shim of a version that is
# installed but not selected resolves to that version's executable.
supported_python() {
  local check="import sys; sys.exit(not (3, $low) <= sys.version_info[:2] < (3, $high))"
  local path version
  if "$1" -c "$check" 2>/dev/null; then
    "$1" -c 'import sys; print(sys.executable)'
    return
  fi
  if [ "${2:-}" = pyenv ] && command -v pyenv >/dev/null 2>&1; then
    for version in $(pyenv whence "$1" 2>/dev/null | sort -rV); do
      path="$(pyenv root)/versions/$version/bin/$1"
      if "$path" -c "$check" 2>/dev/null; then
        echo "$path"
        return
      fi
    done
  fi
}

python=""
if [ -n "${KERAS_ALS_PYTHON:-}" ]; then
  python=$(supported_python "$KERAS_ALS_PYTHON" pyenv)
  if [ -z "$python" ]; then
    echo "setup.sh: KERAS_ALS_PYTHON=$KERAS_ALS_PYTHON does not run, or is not Python" \
      "$supported (what keras_als and its TensorFlow support)." >&2
    exit 1
  fi
else
  candidates=()
  for ((minor = high - 1; minor >= low; minor--)); do candidates+=("python3.$minor"); done
  for candidate in "${candidates[@]}" python3 python; do
    python=$(supported_python "$candidate")
    [ -n "$python" ] && break
  done
  if [ -z "$python" ]; then
    echo "setup.sh: keras_als needs Python $supported (TensorFlow 2.21 has wheels for" \
      "3.10 to 3.13; keras_als needs 3.11 or newer), and none runs from PATH." >&2
    echo "Install one, e.g. 'sudo apt-get install python3.$((high - 1)) python3.$((high - 1))-venv' or" \
      "'pyenv install 3.$((high - 1))', or name one: KERAS_ALS_PYTHON=/path/to/python3.$((high - 1))." >&2
    exit 1
  fi
fi
identity() { "$1" -c 'import platform, sys; print(platform.python_version(), sys.base_prefix)'; }
version=$("$python" -c 'import platform; print(platform.python_version())')
if [ "${1:-}" = --which ]; then
  echo "$python"
  exit 0
fi

if [ -x "$venv/bin/python" ] && [ "$(identity "$venv/bin/python" 2>/dev/null)" != "$(identity "$python")" ]; then
  echo "setup: $venv holds another Python than $python ($version): re-creating it."
  rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi

stamp=$venv/.keras_als-installed
extras=dev,plots,demo
# The editable install points at this checkout: a venv kept elsewhere (as
# .ci/run keeps its extra ones) is re-installed for each new checkout.
constraints=()
if [ "$oldest" = 1 ]; then
  constraints=(-c scripts/oldest.txt)
fi
want=$( (cat pyproject.toml; pwd; echo "$extras"; if [ "$oldest" = 1 ]; then cat scripts/oldest.txt; fi) |
  sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing keras_als[$extras]${constraints[*]:+ with ${constraints[*]}}" \
    "into $venv with Python $version ($python); the first time takes a few minutes."
  log=$venv/pip.log
  # pip's own output goes to the log (this machine's pip configuration and
  # setuptools warn on every install); on failure the log is shown whole.
  if ! { "$venv/bin/python" -m pip install --upgrade pip &&
         "$venv/bin/python" -m pip install "${constraints[@]}" -e ".[$extras]"; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup.sh: pip failed (above, and in $log)." >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
echo "setup: Python $version in $venv"
