#!/usr/bin/env bash
# The main job: trains a CNN on real MNIST, then a KerasHub SegFormer, under float32, Keras's
# LossScaleOptimizer and keras_als, and prints what each achieved.
# KERAS_ALS_PYTHON and KERAS_ALS_VENV choose the Python and the venv (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=3  # TensorFlow's C++ INFO and WARNING lines
exec "${KERAS_ALS_VENV:-.venv}/bin/python" examples/demo.py "$@"
