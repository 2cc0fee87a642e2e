#!/usr/bin/env bash
# The main job: trains a CNN on real MNIST three ways and prints what each achieved.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
