"""Finds private Keras and TensorFlow APIs used in keras_als's source, read with `ast`.

The rule (issue 82): every private Keras/TensorFlow API keras_als uses lives
in `keras_als/_keras_private.py`. Elsewhere this reports:

- an import of `keras.src` or `tensorflow.python`, and `tf.__internal__`;
- an attribute `X._name` (one leading underscore or a mangled `__name`, not
  a dunder), read, written or called, and the same name given as a string
  to `getattr`, `setattr`, `hasattr`, `delattr`, `object.__setattr__` and
  the like, or to `vars(X).get`, `.pop` or `.setdefault`;

unless the name is keras_als's own. It is when:

- keras_als defines it: assigns `X._name = ...` (`self._owner`,
  `optimizer._keras_als_planned_in`), defines it in a class body (a method
  `_declare_weights`), or stores it by a string (`object.__setattr__(layer,
  _HOOK, ...)` with `_HOOK = "_keras_als_hook"` in the module, or
  `vars(optimizer).setdefault("_keras_als_warned", ...)`), and the name is not
  one real Keras/TensorFlow objects carry (`keras_names`). So `self` alone
  proves nothing: the optimizer and the wrapper subclass Keras classes, and
  `self._trainable_variables = ...` or `self._convert_input_args = False`
  there is Keras's private state, not keras_als's;
- `X` is a keras_als module (`_statistics._vector`, after `from keras_als
  import _statistics`): a module-private function or constant of keras_als;
- it is one of `collections.namedtuple`'s documented methods (`_replace`),
  Python's public API, not Keras's.
"""

from __future__ import annotations

import ast

PRIVATE_MODULES = ("keras.src", "tensorflow.python")
NAMEDTUPLE = frozenset({"_replace", "_asdict", "_make", "_fields", "_field_defaults"})
BY_STRING = frozenset({"getattr", "setattr", "hasattr", "delattr"})
"""Built-in functions whose second argument names an attribute."""
OBJECT_METHODS = frozenset({"__getattribute__", "__setattr__", "__delattr__"})
"""`object.<method>(instance, name, ...)`: the same, past a class's own."""
VARS_METHODS = frozenset({"get", "pop", "setdefault"})
"""`vars(instance).<method>(name, ...)`: an attribute by its key in `__dict__`."""
STORING = frozenset({"setattr", "__setattr__", "setdefault"})


def is_private(name: str) -> bool:
    """`_name` or a mangled `__name`; not a dunder such as `__dict__`."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(path: str) -> str:
    """`keras_als/sub/_x.py` -> `keras_als.sub._x` (`__init__.py`: its package)."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "string"` assignments (`_HOOK = "_keras_als_hook"`)."""
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def _named_by_string(node: ast.Call, constants: dict[str, str]) -> tuple[str, str] | None:
    """`(name, function)` where call `node` names an attribute by a string, else None."""
    function, name = node.func, None
    if isinstance(function, ast.Name) and function.id in BY_STRING and len(node.args) >= 2:
        name, called = node.args[1], function.id
    elif isinstance(function, ast.Attribute) and len(node.args) >= 1:
        owner, called = function.value, function.attr
        if called in OBJECT_METHODS and isinstance(owner, ast.Name) and owner.id == "object":
            name = node.args[1] if len(node.args) >= 2 else None
        elif (
            called in VARS_METHODS
            and isinstance(owner, ast.Call)
            and isinstance(owner.func, ast.Name)
            and owner.func.id == "vars"
        ):
            name = node.args[0]
    if isinstance(name, ast.Name):
        name = ast.Constant(constants.get(name.id))
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        return name.value, called
    return None


def own_names(trees: dict[str, ast.Module], keras_names: set[str]) -> set[str]:
    """The private attribute names keras_als defines (see the module docstring)."""
    names = set()
    for tree in trees.values():
        constants = _constants(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                names.add(node.attr)
            elif isinstance(node, ast.ClassDef):
                for statement in node.body:
                    if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef):
                        names.add(statement.name)
                    targets = getattr(statement, "targets", [getattr(statement, "target", None)])
                    names.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, ast.Call):
                named = _named_by_string(node, constants)
                if named is not None and named[1] in STORING:
                    names.add(named[0])
    return {name for name in names if is_private(name)} - keras_names


def _modules_bound(tree: ast.Module, path: str, modules: set[str]) -> dict[str, str]:
    """Local names bound to a keras_als module by the imports of `tree`, the
    module at `path` (name: module)."""
    package = path.split("/")[:-1]
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    bound[top] = top
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x; from ..sub import y
                base = ".".join(package[: len(package) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
    return {name: full for name, full in bound.items() if full in modules}


def _dotted(node: ast.AST, bound: dict[str, str]) -> str | None:
    """The module a `Name` or `Name.attr...` chain denotes, if bound to one."""
    if isinstance(node, ast.Name):
        return bound.get(node.id)
    if isinstance(node, ast.Attribute):
        outer = _dotted(node.value, bound)
        return f"{outer}.{node.attr}" if outer else None
    return None


def _imports_private(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
    else:
        return None
    for name in names:
        if any(name == p or name.startswith(f"{p}.") for p in PRIVATE_MODULES):
            return f"import of {name}"
    return None


def offenders(sources: dict[str, str], keras_names: set[str]) -> list[str]:
    """`path:line: what` for each private Keras/TensorFlow access in `sources`.

    Args:
        sources: the source of each module, by its path from the repository
            (`keras_als/float32/_forward_checks.py`); `keras_als/_keras_private.py`
            is to be left out by the caller.
        keras_names: the private names real Keras/TensorFlow objects carry.

    Returns:
        One line per offending access, in the order of `sources` and lines.
    """
    trees = {path: ast.parse(text, filename=path) for path, text in sources.items()}
    own = own_names(trees, keras_names) | NAMEDTUPLE
    modules = {module_name(path) for path in trees}
    found = []
    for path, tree in trees.items():
        bound = _modules_bound(tree, path, modules)
        constants = _constants(tree)
        for node in ast.walk(tree):
            what = _imports_private(node)
            if isinstance(node, ast.Attribute):
                if node.attr == "__internal__" or (
                    is_private(node.attr)
                    and node.attr not in own
                    and _dotted(node.value, bound) not in modules
                ):
                    what = ast.unparse(node)
            elif isinstance(node, ast.Call):
                named = _named_by_string(node, constants)
                if named is not None and is_private(named[0]) and named[0] not in own:
                    what = ast.unparse(node)
            if what is not None:
                found.append((path, node.lineno, what))
    return [f"{path}:{line}: {what}" for path, line, what in sorted(found)]


def keras_names() -> set[str]:
    """The private names (attributes, methods) of the Keras and TensorFlow
    objects keras_als subclasses or handles: a built layer, a wrapper, graph
    and Sequential models, a built LossScaleOptimizer, a callback, variables,
    a symbolic tensor and a graph."""
    import keras
    import tensorflow as tf

    dense = keras.layers.Dense(2)
    dense.build((None, 3))
    inputs = keras.Input((3,))
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD())
    optimizer.build(dense.trainable_variables)
    objects = [
        dense,
        keras.layers.Wrapper(keras.layers.Dense(2)),
        keras.Model(inputs, keras.layers.Dense(1)(inputs)),
        keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)]),
        optimizer,
        optimizer.inner_optimizer,
        keras.callbacks.Callback(),
        dense.kernel,
        tf.Variable(1.0),
        inputs,
        tf.Graph(),
    ]
    return {name for thing in objects for name in dir(thing) if is_private(name)}
