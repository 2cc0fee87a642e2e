"""The optimizer's scale entries: whose each is, and the names they are reported by.

`AdaptiveLossScaleOptimizer` keeps one entry per trainable variable in its
state (entry 0 is the loss's, entry `1 + i` the `i`-th variable's), so the
size of its state depends on the variables alone: a `.keras` file saved from
an instrumented model loads into the plain one, to be instrumented again. A
traced step's plan makes every entry of a scale component hold that
component's scale. A scale is reported by the entry of its owner's first
variable, under the shortest suffix of the owner's path that no other owner
shares.
"""

from __future__ import annotations

from collections.abc import Sequence

from keras_als.step._layer_call import owner_of


def owners(variables: Sequence) -> list[tuple[object, int]]:
    """`(owner, entry)` for each owner of `variables`, in variable order.

    Example:

    >>> import keras, keras_als
    >>> from keras_als.step import _entries
    >>> head = keras.layers.Dense(1, name="head")
    >>> model = keras_als.wrap_model(keras.Sequential([keras.Input((2,)), head]))
    >>> [(owner.layer.name, entry) for owner, entry in _entries.owners(model.trainable_variables)]
    [('head', 1)]
    """
    found, seen = [], set()
    for i, variable in enumerate(variables):
        owner = owner_of(variable)
        if owner is not None and id(owner) not in seen:
            seen.add(id(owner))
            found.append((owner, 1 + i))
    return found


def names(paths: Sequence[str]) -> list[str]:
    """For each path, its shortest suffix (of whole `/` parts) no other path ends with.

    Two equal paths (two layers of one name built outside any other layer)
    are told apart by a count: `"dense"`, `"dense#2"`.

    Example:

    >>> from keras_als.step._entries import names
    >>> names(["model/dense", "block_0/attention/query", "block_1/attention/query", "dense"])
    ['model/dense', 'block_0/attention/query', 'block_1/attention/query', 'dense']
    >>> names(["head", "head"])
    ['head', 'head#2']
    """
    parts = [path.split("/") for path in paths]
    chosen = []
    for i, own in enumerate(parts):
        for length in range(1, len(own) + 1):
            suffix = own[-length:]
            if all(other[-length:] != suffix for j, other in enumerate(parts) if j != i):
                break
        chosen.append("/".join(suffix))
    seen: dict[str, int] = {}
    for i, name in enumerate(chosen):
        seen[name] = seen.get(name, 0) + 1
        if seen[name] > 1:
            chosen[i] = f"{name}#{seen[name]}"
    return chosen


def scaled(state) -> list[tuple[object, int, str]]:
    """`(owner, entry, name)` of every layer with a scale among the variables
    `state` (the optimizer's `_state.ScaleState`) was built for (empty before)."""
    found = owners(state.trainable_variables)
    chosen = names([owner.scale_path for owner, _ in found])
    return [(owner, entry, name) for (owner, entry), name in zip(found, chosen)]


def named(state) -> tuple[list[str], list[int]]:
    """The names of `layer_scales()` and the entry each is read from (`"loss"`: 0)."""
    found = scaled(state)
    return ["loss", *(name for _, _, name in found)], [0, *(e for _, e, _ in found)]
