"""The suite behind RESULTS.md: its targets, tables, plots and rendering.

`python -m benchmarks.run` (`benchmarks/run.py`) measures four studies
(`fidelity`, `convergence`, `cost`, `memory`); this package judges them against
the five targets of issue 3 (`targets`), renders their tables (`tables`) and
plots (`plots`), and writes RESULTS.md and results.json (`results_md`), taking
in the tables the studies with their own commands wrote.
"""
