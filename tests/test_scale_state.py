"""The optimizer's state is one explicit object, `_state.ScaleState` (issue 82).

The traced step's functions and the telemetry are given the optimizer's
`scaling`, never the optimizer, and read or write nothing of it that the
class does not declare; the optimizer holds the state's variables under the
names Keras and checkpoints know.
"""

import ast
import pathlib

import keras
import numpy as np
import pytest

import keras_als
from keras_als.step import _apply_phases, _skip, _state

PACKAGE = pathlib.Path(keras_als.__file__).parent
READERS = sorted((PACKAGE / "step").glob("*.py")) + [PACKAGE / "telemetry" / "_telemetry.py"]
"""The modules whose functions take the state: the step's and the telemetry's."""
KEYED_BY_THE_OPTIMIZER = {"_step_record.py"}
"""The step record keeps each traced graph's plans per optimizer, weakly: it
takes the optimizer as a key, and reads nothing of it."""


def _declared() -> set[str]:
    """What `ScaleState` declares: its slots, properties and methods."""
    return set(_state.ScaleState.__slots__) | {
        name for name in vars(_state.ScaleState) if not name.startswith("__")
    }


def _reads_of_state(path: pathlib.Path) -> dict[str, set[str]]:
    """Per function of `path` with a parameter `state`: the names it takes of it
    (`state.<name>`, read, written or called), nested functions included."""
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.FunctionDef):
            continue
        if "state" not in [a.arg for a in node.args.args + node.args.kwonlyargs]:
            continue
        found[node.name] = {
            inner.attr
            for inner in ast.walk(node)
            if isinstance(inner, ast.Attribute)
            and isinstance(inner.value, ast.Name)
            and inner.value.id == "state"
        }
    return found


def test_the_step_and_the_telemetry_take_of_the_state_only_what_the_class_declares():
    declared = _declared()
    taken = {
        f"{path.name}:{function}": names
        for path in READERS
        for function, names in _reads_of_state(path).items()
    }
    undeclared = {where: sorted(n - declared) for where, n in taken.items() if n - declared}
    assert undeclared == {}
    every = set().union(*taken.values())
    # Not vacuous: the counters, the table, the settings and the inner optimizer are read.
    assert {"counter", "row", "assign", "policy", "inner_optimizer", "iterations"} <= every


def test_no_function_of_the_step_or_the_telemetry_takes_the_optimizer():
    taking = [
        f"{path.name}:{node.name}"
        for path in READERS
        if path.name not in KEYED_BY_THE_OPTIMIZER
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef)
        and "optimizer" in [a.arg for a in node.args.args + node.args.kwonlyargs]
    ]
    assert taking == []


def test_the_state_takes_no_attribute_it_does_not_declare():
    state = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()).scaling
    with pytest.raises(AttributeError):
        state.undeclared = 1


def test_a_training_step_is_given_the_state_and_never_the_optimizer(monkeypatch):
    given = []

    def recording(function):
        def record(state, *args, **kwargs):
            given.append((function.__name__, state))
            return function(state, *args, **kwargs)

        return record

    monkeypatch.setattr(_apply_phases, "run", recording(_apply_phases.run))
    monkeypatch.setattr(_skip, "apply_if_finite", recording(_skip.apply_if_finite))
    model = keras_als.wrap_model(
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(2), keras.layers.Dense(1)])
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0)
    assert {name for name, _ in given} == {"run", "apply_if_finite"}
    assert all(state is optimizer.scaling for _, state in given)


def test_the_settings_are_the_state_s_and_the_variables_keep_keras_s_names():
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(), measure_every_n_steps=4, warn_after_skipped_steps=7
    )
    state = optimizer.scaling
    assert (state.measure_every_n_steps, state.warn_after_skipped_steps) == (4, 7)
    optimizer.estimate_underflow = True  # as ScaleMonitor does
    assert state.estimate_underflow is True
    assert state.policy is optimizer.policy and not state.built
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    optimizer.build(model.trainable_variables)
    assert state.built and state.trainable_variables == tuple(model.trainable_variables)
    for name in ("scale_state", "step_counter", "dynamic_scale"):
        assert getattr(optimizer, name) is getattr(state, name)
    assert [v.path.split("/")[-1] for v in optimizer.variables[:5]] == [
        "iteration",
        "learning_rate",
        "scale_state",
        "step_counter",
        "dynamic_scale",
    ]
    assert state.iterations is optimizer.iterations
