"""Profiles: where keras_als's cost goes, and how widely `wrap_model` applies.

The cost studies (`benchmarks.suite.cost`, `benchmarks.real_models`) say how
much slower or larger keras_als's step is than Keras's `LossScaleOptimizer`'s;
these profiles say where, and try many more models briefly. Each is one
module with its own command, `python -m benchmarks.profiles NAME [ARGS]`
(or `python -m benchmarks.profiles.NAME [ARGS]`); `PROFILES` lists them.
"""

PROFILES = {
    "step_profile": "Where does a real model's compiled step spend the time keras_als adds?",
    "first_step": "Where does a real-size model's compiled first step spend the time "
    "keras_als adds: tracing, TensorFlow-to-XLA, or XLA?",
    "trace_profile": "Where does a real model's first step without XLA spend the time "
    "keras_als adds: tracing, or TensorFlow's graph work?",
    "bridge_ops": "What does TensorFlow's lowering to XLA cost per operation, by kind?",
    "update_fusions": "Why is Keras's first step, not keras_als's, the slow one on the "
    "deepest nets?",
    "peak_buffers": "Which buffers does XLA count in a compiled step's peak memory?",
    "variable_cost": "What does each variable a compiled step updates cost it?",
    "monitor_cost": "What does `keras_als.ScaleMonitor` cost a step?",
    "step_program": "What program does XLA compile for the training step, and did a change "
    "alter it?",
    "margin_sweep": "How many steps does `MaxSafe` skip at each margin, at what accuracy?",
    "wrap_sweep": "Does `wrap_model` instrument and train many more models of the real "
    "models' families?",
}
"""Each profile's module name and the question it answers."""
