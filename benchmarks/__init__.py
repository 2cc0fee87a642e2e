"""keras_als's benchmarks: what adaptive loss scaling does, against Keras's own.

One package per study, each run as `python -m benchmarks.<study>` (the
studies, their questions, commands and runtimes: `benchmarks/README.md`):

- `suite/`: the suite behind RESULTS.md, `python -m benchmarks.suite`: four
  studies (`fidelity`, `convergence`, `cost`, `memory`), the five targets,
  the tables and plots.
- `real_models/`, `loss_span/`, `heavy_tails/`, `hard_outcomes/`,
  `detection/`, `flat_regions/`, `keras_hub_tasks/`: one study each, with its
  plan, training, report and command.
- `profiles/`: where keras_als's cost goes (`step_profile`, `trace_profile`,
  `variable_cost`, `monitor_cost`) and `wrap_sweep`,
  `python -m benchmarks.profiles NAME`.
- `harness/`: what every study shares: the methods compared, the compiled
  XLA step, seeds and fresh processes, paired statistics, provenance, memory
  readers, the suite's small models and data (`zoo`) and tiny KerasHub tasks
  (`hub_tasks`).
- `results/`: what the commands wrote (generated; never edited by hand).
"""
