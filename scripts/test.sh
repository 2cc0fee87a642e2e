#!/usr/bin/env bash
# Runs the whole test suite (slow tests included), the doctests and ruff.
# Fails when pytest collects no test (exit code 5).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check keras_als tests benchmarks examples
status=0
TF_CPP_MIN_LOG_LEVEL=3 .venv/bin/python -m pytest "$@" || status=$?
if [ "$status" -eq 5 ]; then
  echo "pytest collected no tests: failing." >&2
  exit 1
fi
exit "$status"
