"""The architecture's rules, checked on the code (see docs/guide/architecture.md).

State passes between the phases of a step only through `_step_record`, and
lives on the traced graph; ownership flows one way (the wrapper declares, the
optimizer reads); a plan cannot change after it is made; no module takes a
name private to another.
"""

import ast
import dataclasses
import importlib
import pathlib
import pkgutil
import threading
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als.step import _step_record
from tests.private_access import is_private

PACKAGE = pathlib.Path(keras_als.__file__).parent
REPOSITORY = pathlib.Path(__file__).parent.parent
MUTABLE = (
    dict,
    list,
    set,
    bytearray,
    weakref.WeakKeyDictionary,
    weakref.WeakValueDictionary,
    threading.local,
)


def _modules():
    """Every module of the package, its sub-packages' included."""
    found = pkgutil.walk_packages([str(PACKAGE)], prefix="keras_als.")
    return [importlib.import_module(m.name) for m in found]


def _in_a_circle(graph: dict[str, set[str]]) -> list[str]:
    """The modules of `graph` (module: the names it imports) that reach themselves
    through the imports between its modules (other names are left out)."""
    # A package naming itself (`from keras_als.policies import _policy_rules` in its
    # __init__) imports its own modules: no circle.
    graph = {
        name: {i for i in imports if i in graph and i != name} for name, imports in graph.items()
    }

    def reach(start):
        seen, todo = set(), list(graph[start])
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(graph[name])
        return seen

    return sorted(name for name in graph if name in reach(name))


CONCERNS = {
    "step": "the traced training step: record, boundaries, plan, crossings, apply's phases",
    "policies": "the scale policies, pure functions of (statistics, state)",
    "float32": "the layers float16 cannot hold: diagnose, calibrate, Float32Fallback",
    "telemetry": "what the optimizer says: telemetry, warnings, ScaleMonitor, plot_scales",
}
TOP_LEVEL = {"__init__", "_version", "_keras_private", "optimizer", "wrapper", "instrument"}
"""The modules at the top: the public surface, the version, the one module of
private Keras/TensorFlow APIs, and the three objects a user holds."""


def test_the_folder_tree_names_the_four_concerns_and_nothing_else_lies_at_the_top():
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(CONCERNS)
    assert {p.stem for p in PACKAGE.glob("*.py")} == TOP_LEVEL
    for name in CONCERNS:
        module = importlib.import_module(f"keras_als.{name}")
        assert module.__doc__, f"keras_als.{name} says nothing"


def test_no_modules_of_the_package_import_each_other_in_a_circle():
    graph = {m.__name__: _imports(pathlib.Path(m.__file__)) for m in _modules()}
    assert _in_a_circle(graph) == []


def _module_graph(folder: str) -> dict[str, set[str]]:
    """Every module under `folder` of the repository (dotted name: what it
    imports, imports inside functions too), read from the source, not imported."""
    graph = {}
    for path in sorted((REPOSITORY / folder).rglob("*.py")):
        parts = path.relative_to(REPOSITORY).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = _imports(path)
    return graph


@pytest.mark.parametrize("folder", ["benchmarks", "tests"])
def test_no_modules_of_the_benchmarks_or_the_tests_import_each_other_in_a_circle(folder):
    """Imports inside functions count: they only put the circle off until a call
    (on the layout before issue 67 this named `benchmarks.cost`,
    `benchmarks.memory`, `benchmarks.suite.tables` and `benchmarks.suite.targets`)."""
    assert _in_a_circle(_module_graph(folder)) == []


LONGEST_FILE = 400
"""Lines: the longest a module of the package, the benchmarks or the tests may be."""


def test_no_python_file_of_the_package_the_benchmarks_or_the_tests_is_over_400_lines():
    long = [
        f"{path.relative_to(REPOSITORY)} ({lines} lines)"
        for folder in ("keras_als", "benchmarks", "tests")
        for path in sorted((REPOSITORY / folder).rglob("*.py"))
        if (lines := len(path.read_text().splitlines())) > LONGEST_FILE
    ]
    assert long == []


def test_no_module_keeps_mutable_state_at_module_level():
    stores = [
        f"{module.__name__}.{name}"
        for module in _modules()
        for name, value in vars(module).items()
        if not name.startswith("__") and isinstance(value, MUTABLE)
    ]
    assert stores == []


SCREENS = 80
"""Lines in two screens: the longest a function may be, docstring included."""


def test_every_function_of_the_package_fits_on_two_screens():
    long = [
        f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > SCREENS
    ]
    assert long == []


def _code_lines(path: pathlib.Path, node: ast.AST) -> int:
    """Lines of `node` that are code: not blank, not a comment, not a docstring."""
    lines = path.read_text().splitlines()[node.lineno - 1 : node.end_lineno]
    docstrings = set()
    for inner in ast.walk(node):
        if isinstance(inner, (ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(inner):
            first = inner.body[0]
            docstrings.update(range(first.lineno, first.end_lineno + 1))
    return sum(
        1
        for number, line in enumerate(lines, start=node.lineno)
        if line.strip() and not line.strip().startswith("#") and number not in docstrings
    )


def _optimizer_class() -> tuple[pathlib.Path, ast.ClassDef]:
    path = PACKAGE / "optimizer.py"
    (optimizer,) = [
        node
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ClassDef) and node.name == "AdaptiveLossScaleOptimizer"
    ]
    return path, optimizer


def test_the_optimizer_class_code_fits_on_two_screens():
    """Its docstrings (the public API's documentation) aside: the phases of a
    step, the state and its updates live in `_apply_phases`, `_state` and `_scale_state`."""
    path, optimizer = _optimizer_class()
    assert _code_lines(path, optimizer) <= 2 * SCREENS


OPTIMIZER_CLASS_LINES = 300
"""Lines from `class AdaptiveLossScaleOptimizer` to its end, docstrings included."""


def test_the_optimizer_class_with_its_documentation_is_at_most_300_lines():
    """Past it, move a helper out (to `_apply_phases`, `_telemetry`, `_scale_state`
    or `_mistakes`) or tighten a docstring's wording; never drop documentation of
    public behaviour or a docstring example."""
    _, optimizer = _optimizer_class()
    assert optimizer.end_lineno - optimizer.lineno + 1 <= OPTIMIZER_CLASS_LINES


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def _is_module(dotted: str) -> bool:
    """Whether `dotted` (`keras_als.step._plan`) names a module or package of the repository."""
    place = REPOSITORY.joinpath(*dotted.split("."))
    return place.with_suffix(".py").is_file() or (place / "__init__.py").is_file()


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module `node` imports from, made absolute (`from ..x import y` in `package`)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _dotted(node: ast.AST) -> str | None:
    """`a.b.c` for a chain of names and attributes, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (owner := _dotted(node.value)) is not None:
        return f"{owner}.{node.attr}"
    return None


FIX = (
    "move what is shared into a private module (keras_als/**/_*.py) under a name without the "
    "underscore, documented; or call the object's public method (the optimizer's)"
)


def private_names_reached(source: str, path: str) -> list[str]:
    """`path:line` and the fix for each name private to another keras_als module
    that `source` (the file at `path`, from the repository) takes: `from
    keras_als.x import _name`, or `x._name` where `x` is a keras_als module the
    file imports. A private module itself (`from keras_als.step import _plan`,
    `keras_als.step._plan`) is the package's to import."""
    parts = pathlib.PurePosixPath(path).with_suffix("").parts
    package = ".".join(parts[:-1])  # of `x.py` and of `__init__.py` alike
    tree = ast.parse(source)
    modules, found = {}, []  # modules: local name -> the keras_als module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            origin = _absolute(node, package)
            if origin.split(".")[0] != "keras_als":
                continue
            for alias in node.names:
                full = f"{origin}.{alias.name}"
                if _is_module(full):
                    modules[alias.asname or alias.name] = full
                elif is_private(alias.name):
                    found.append(
                        f"{path}:{node.lineno}: `from {origin} import {alias.name}` takes a "
                        f"name private to {origin}: {FIX}"
                    )
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "keras_als":
                    local = alias.asname or alias.name.split(".")[0]
                    modules[local] = alias.name if alias.asname else "keras_als"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not is_private(node.attr):
            continue
        owner = _dotted(node.value)
        if owner is None or owner.split(".")[0] not in modules:
            continue
        first, _, rest = owner.partition(".")
        module = ".".join(filter(None, [modules[first], rest]))
        if _is_module(module) and not _is_module(f"{module}.{node.attr}"):
            found.append(
                f"{path}:{node.lineno}: `{owner}.{node.attr}` reaches a name private to "
                f"{module}: {FIX}"
            )
    return found


def test_no_module_of_the_package_takes_a_name_private_to_another():
    """Sub-packages included: `rglob`."""
    found = [
        finding
        for path in sorted(PACKAGE.rglob("*.py"))
        for finding in private_names_reached(
            path.read_text(), path.relative_to(REPOSITORY).as_posix()
        )
    ]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    ("source", "path", "reached"),
    [
        ("from keras_als.float32.diagnosis import _loss_of", "keras_als/float32/calibration.py", 1),
        (
            "from keras_als.float32 import diagnosis\ndiagnosis._state_kept(m)",
            "keras_als/float32/fallback.py",
            1,
        ),
        (
            "from keras_als.float32 import _forward_checks as f\nf._helper()",
            "keras_als/float32/diagnosis.py",
            1,
        ),
        (
            "import keras_als.float32.diagnosis\nkeras_als.float32.diagnosis._loss_of",
            "keras_als/x.py",
            1,
        ),
        ("import keras_als.float32.diagnosis as d\nd._loss_of", "keras_als/x.py", 1),
        ("from ..float32.diagnosis import _loss_of", "keras_als/step/x.py", 1),
        ("from . import _telemetry\n_telemetry.read(o)", "keras_als/telemetry/x.py", 0),
        ("from . import _telemetry\n_telemetry._FLOOR", "keras_als/telemetry/x.py", 1),
        (
            "from keras_als.telemetry import _telemetry\n_telemetry._FLOOR",
            "keras_als/float32/fallback.py",
            1,
        ),
        (
            "from keras_als.step import _scale_state\n_scale_state.counter(o, 'x')",
            "keras_als/x.py",
            0,
        ),
        ("from keras_als.policies._policy_terms import FLOAT16_MAX", "keras_als/x.py", 0),
        ("import keras_als\nkeras_als._version.version()", "keras_als/x.py", 0),
        ("from keras_als import _version\nself._owner = 1", "keras_als/x.py", 0),
    ],
)
def test_the_private_name_check_finds_what_it_is_for(source, path, reached):
    found = private_names_reached(source, path)
    assert len(found) == reached, found
    for finding in found:
        assert finding.startswith(f"{path}:") and "private module" in finding


@pytest.mark.parametrize("module", ["wrapper", "step/_boundary", "step/_plan", "step/_step_record"])
def test_the_forward_side_does_not_import_the_optimizer(module):
    """The wrapper declares what it owns and the optimizer reads it, not back."""
    assert "keras_als.optimizer" not in _imports(PACKAGE / f"{module}.py")


def test_a_plan_cannot_change_after_it_is_made():
    model = keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((3,)),
                keras.layers.Dense(2, name="hidden"),
                keras.layers.Dense(1, name="out"),
            ]
        )
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD())
    optimizer.build(model.trainable_variables)

    @tf.function
    def plan():
        optimizer.scale_loss(tf.reduce_sum(model(tf.ones((1, 3)))))
        return tf.constant(0)

    plan()
    made = _step_record.read(plan.get_concrete_function().graph).plan_for(optimizer)
    assert [c.name for c in made.components] == ["loss", "hidden"]  # "out" holds the loss's
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.scales = np.ones(3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.components[0].entry = 5
    with pytest.raises(TypeError):
        made.component_of[0] = 1
    with pytest.raises(TypeError):
        made.factors[0] = 1.0


def test_the_step_record_is_per_graph_and_empty_outside_a_traced_function():
    model = keras_als.wrap_model(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))

    @tf.function
    def forward(x):
        return model(x)

    forward(tf.ones((1, 3)))
    forward(tf.ones((2, 3)))  # another shape: a second trace, a second graph
    graphs = [f.graph for f in forward._list_all_concrete_functions_for_serialization()]
    assert len(graphs) == 2
    assert [len(_step_record.read(g).boundaries) for g in graphs] == [1, 1]
    assert _step_record.read().boundaries == ()  # eager: nothing recorded
