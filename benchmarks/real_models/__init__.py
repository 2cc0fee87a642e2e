"""Real architectures: keras.applications and KerasHub models, built offline.

The models users train, not ones written here: keras.applications MobileNetV2
and ResNet50V2 (`weights=None`, 32x32 inputs) and tiny KerasHub GPT-2 and BERT
backbones built from their constructors (no download), each under a small head
with float32 outputs; and, to show the fixes hold beyond those four, more models
of the same families (`OTHER_FAMILIES`). The test suite
(`tests/test_real_models.py`) and the benchmark's real-model section build them
from here.

`python -m benchmarks.real_models [--steps N] [--models a,b] [--parts PARTS]`
(parts: skips, cost, step, breakdown, graph) trains each model under
mixed_float16 with XLA, with Keras's `LossScaleOptimizer` and with keras_als
on the same weights and batches, and prints the skipped steps (in the first 50
steps and in the rest), and the cost of keras_als over Keras's: step time
(`--instances` compiled instances of each, 3 by default, steps interleaved,
with a standard error: `step_times`; with `--processes P`, in P fresh
processes, the standard error from their spread: `step_times_in_processes`),
compile time (first step in fresh processes, with and without XLA) and XLA
step memory (fresh processes, see `benchmarks.suite.memory`); `breakdown` times
ablations that show what the step time is spent on (`step_breakdown`);
`graph` counts the operations of each method's traced step (`graph_ops`). It
writes benchmarks/results/real_models.json and .md; a run of one part keeps
the other's results.

Targets (issue 12): skipped steps in the first 50 at most Keras's, and at most
1 per 1000 after; step time <= 1.03x, compile time <= 1.25x and XLA step memory
<= 1.05x Keras's.

Modules: `architectures` (builders, data, `build`), `skips` (skipped steps),
`timing` (step time), `breakdown` (step-time ablations), `programs` (traced
operations, compiled kernels, HLO), `probes` (compile time and memory in
fresh processes), `report` (verdicts and real_models.md), `command` (the
command line).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
