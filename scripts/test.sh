#!/usr/bin/env bash
# Runs the whole test suite (slow tests included), the doctests and ruff.
# Extra arguments go to pytest (e.g. test files, -m "not slow"). Fails when
# pytest collects no test (exit code 5). KERAS_ALS_PYTHON and KERAS_ALS_VENV
# choose the Python and the venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv=${KERAS_ALS_VENV:-.venv}
"$venv/bin/ruff" check keras_als tests benchmarks examples
status=0
# Two workers (pytest-xdist): one per core; KERAS_ALS_TEST_WORKERS=0 runs in one process.
TF_CPP_MIN_LOG_LEVEL=3 "$venv/bin/python" -m pytest -n "${KERAS_ALS_TEST_WORKERS:-2}" --maxschedchunk 1 --durations=30 "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing." >&2
  exit 1
fi
exit "$status"
