#!/usr/bin/env bash
# Creates .venv with Python 3.11 and installs keras_als with its test and demo
# extras. Idempotent: does nothing when .venv is already up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

python=""
for candidate in python3.11 python3 python; do
  if command -v "$candidate" >/dev/null 2>&1 &&
     "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    python="$candidate"; break
  fi
done
if [ -z "$python" ]; then
  echo "keras_als needs Python 3.11 (python3.11 on PATH)." >&2
  exit 1
fi

[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.keras_als-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -e ".[test,demo]"
  echo "$want" > "$stamp"
fi
