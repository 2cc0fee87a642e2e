"""keras_als's benchmarks: what adaptive loss scaling does, against Keras's own.

The tree (the studies, their questions and commands: `benchmarks/README.md`):

- `harness/`: what every study shares: the methods compared, the compiled
  XLA step, seeds and fresh processes, paired statistics, provenance.
- `zoo.py`: the suite's models and data (real architectures live with their
  study, in `real_models/architectures.py`).
- `run.py` and `suite/`: `python -m benchmarks.run`, the suite behind
  RESULTS.md: four studies (`fidelity`, `convergence`, `cost`, `memory`),
  the five targets, the tables and plots.
- One module or package per study with its own command: `real_models/`,
  `detection/`, `heavy_tails/`, `loss_span/`, `hard_outcomes`, `wrap_sweep`,
  `step_profile`, `variable_cost`, `monitor_cost`. A study that is one module
  is a file; one that needs several is a package, run as
  `python -m benchmarks.<study>` through its `__main__.py`.
- `results/`: what the commands wrote (generated; never edited by hand).
"""
