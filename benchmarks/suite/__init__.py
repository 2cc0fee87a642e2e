"""The suite behind RESULTS.md: four studies, their targets, tables and plots.

`python -m benchmarks.suite` (`command`) measures four studies: how far each
method's gradients are from float32's (`fidelity`), whether training reaches
float32's accuracy (`convergence`), the compiled step's time (`cost`) and
memory (`memory`). It judges them against the five targets of issue 3
(`targets`), renders their tables (`tables`) and plots (`plots`), and writes
RESULTS.md and results.json (`results_md`), taking in the tables the studies
with their own commands wrote. `records` holds the step-time and memory
records the studies hand to the targets and tables.
"""
