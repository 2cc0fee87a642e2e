"""The plan of one traced training step: scale components and their scales.

`make_plan` runs inside `scale_loss`, after the forward pass and before
`tape.gradient`. It walks the traced graph back from the loss, and from the
input of every boundary it reaches, stopping at boundary outputs. Ops reached
from one another without crossing a boundary form one *scale component*; the
walk goes through variable handles too, so two reads of one variable (a shared
layer) join their components. Every gradient inside a component carries the
component's scale, which makes sums of gradients (fan-out, residual adds,
shared layers, several outputs) consistent by construction.

Each component is held by one *entry* of the optimizer's scale vector (0 is the
loss's, then one per trainable variable, `_entries`): the loss's for the loss's
component, else the entry of a scaled layer whose weights lie in it, else that
of another variable in it, else (a component with no variables) that of a
component its gradient comes from. Every other entry of a variable in the
component is kept equal to it, as an alias. A boundary from
component `a` (input side) to `b` divides the gradient by
`scale[b] / scale[a]` (or multiplies it by the reciprocal, `_boundary`).
The regions between boundaries before components merge by entry (*sides*)
also tell `_join_bounds` which boundaries to bound rather than read.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping, Sequence

import tensorflow as tf

from keras_als import policies
from keras_als.step import _boundary, _crossings, _entries, _indices, _join_bounds


@dataclasses.dataclass(frozen=True)
class Component:
    """One scale component of a traced graph.

    Attributes:
        entry: The entry of the optimizer's scales that holds its scale.
        name: The name of that entry (a wrapped layer's, or `"loss"`).
        aliases: More entries kept equal to it (wrapped layers whose weights lie
            in this component too).
        inside: Boundaries whose output (the wrapped layer's side) lies here.
        feeding: Boundaries whose input (the upstream side) lies here.
    """

    entry: int
    name: str
    aliases: tuple[int, ...] = ()
    inside: tuple = ()
    feeding: tuple = ()

    def entries(self) -> list[int]:
        """Every entry that holds this component's scale."""
        return [self.entry, *self.aliases]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Components, the scale of each, and where every variable lies.

    Made once per traced step by `make_plan`, never changed after.
    """

    graph: object
    components: tuple[Component, ...]
    scales: tf.Tensor  # float32, one per component, read when the plan was made
    component_of: Mapping[int, int]  # id(variable handle) -> component index
    sides: Mapping[int, tuple[int, int]]  # id(boundary) -> (input side, output side)
    factors: Mapping[int, tf.Tensor]  # id(boundary) -> its divisor, or its reciprocal
    loss_component: int
    built: bool  # scale variables existed when the plan was made
    loss_finite: tf.Tensor  # bool: the loss (forward pass) was finite
    measuring: tf.Tensor | None = None  # bool: this step measures; None: every step does
    crossings: _crossings.Crossings | None = None  # reductions of the boundaries' gradients
    each_scale: tuple = ()  # `scales`, one tensor each, read at runtime indices (`_indices`)

    def reciprocal_of(self, variable) -> tf.Tensor:
        """1 / the scale of `variable`'s component (exact: scales are powers of two)."""
        return 1.0 / self.each_scale[self.index_of(variable)]

    def index_of(self, variable) -> int:
        return self.component_of.get(id(variable.handle), self.loss_component)

    def boundaries(self) -> list[_boundary.Boundary]:
        """Every boundary the walk reached, each once."""
        return [b for c in self.components for b in c.inside]

    def downstream(self) -> tuple[tuple[int, ...], ...]:
        """For each component, the other components whose gradient flows into it."""
        return tuple(
            tuple(sorted({self.sides[id(b)][1] for b in c.feeding} - {i}))
            for i, c in enumerate(self.components)
        )

    def downstream_matrix(self) -> tf.Tensor:
        """`[c, d]` is 1 where gradient flows from component `d` into component `c`."""
        downstream = self.downstream()
        n = len(downstream)
        return tf.constant(
            [[1.0 if d in downstream[c] else 0.0 for d in range(n)] for c in range(n)]
        )


def connect(plan: Plan) -> None:
    """Hands every boundary of `plan` its factor and the plan's crossings, which
    its gradient function reads during backprop (call before `tape.gradient`)."""
    for b in plan.boundaries():
        b.connect(plan.factors.get(id(b)), plan.crossings)


@dataclasses.dataclass
class _Draft:
    """A component while `make_plan` assigns entries (becomes a `Component`)."""

    entry: int | None = None
    name: str = ""
    aliases: list[int] = dataclasses.field(default_factory=list)
    inside: list = dataclasses.field(default_factory=list)
    feeding: list = dataclasses.field(default_factory=list)

    def hold(self, entry: int, name: str) -> None:
        """Takes `entry` as this component's scale, or keeps it equal as an alias."""
        if self.entry is None:
            self.entry, self.name = entry, name
        elif entry != self.entry and entry not in self.aliases:
            self.aliases.append(entry)


class _UnionFind:
    def __init__(self):
        self.parent: list[int] = []

    def new(self) -> int:
        self.parent.append(len(self.parent))
        return len(self.parent) - 1

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, i: int, j: int) -> None:
        i, j = self.find(i), self.find(j)
        if i != j:
            self.parent[max(i, j)] = min(i, j)


def _walk(loss: tf.Tensor, boundaries: list[_boundary.Boundary]):
    """Labels every op behind `loss`; returns labels and reached boundaries."""
    graph = loss.graph
    stop = {}
    for b in boundaries:
        for t in b.outputs:
            stop[t.ref()] = b
    sets = _UnionFind()
    label_of_op: dict[str, int] = {}
    reached: dict[int, tuple[_boundary.Boundary, int, list[int]]] = {}
    order: list[_boundary.Boundary] = []
    pending = [([loss], sets.new())]
    while pending:
        tensors, label = pending.pop()
        stack = list(tensors)
        while stack:
            tensor = stack.pop()
            if getattr(tensor, "graph", None) is not graph:
                continue  # an eager tensor the function captured: a constant to this graph
            if not _join_bounds.carries_gradient(tensor.dtype):
                continue  # two regions sharing only a shape or an index are not joined
            b = stop.get(tensor.ref())
            if b is not None:
                if id(b) not in reached:
                    input_label = sets.new()
                    reached[id(b)] = (b, input_label, [])
                    order.append(b)
                    pending.append((list(b.inputs), input_label))
                reached[id(b)][2].append(label)
                continue
            op = tensor.op
            seen = label_of_op.get(op.name)
            if seen is not None:
                sets.union(seen, label)
                continue
            label_of_op[op.name] = label
            stack.extend(op.inputs)
    for _, _, output_labels in reached.values():
        for other in output_labels[1:]:
            sets.union(output_labels[0], other)
    return sets, label_of_op, [(b, reached[id(b)][1], reached[id(b)][2][0]) for b in order]


def plan_for(state, loss: tf.Tensor, boundaries: Sequence, measures: bool) -> Plan:
    """`make_plan` from the optimizer's `_state.ScaleState`: the variables it
    is built for, their scaled layers (`_entries.scaled`) and current scales;
    the step measures where its countdown (`steps_until_measuring`) is 0, or
    always if `measures` (`keras_als.calibrate`) or `measure_every_n_steps` is 1.
    Joins are bounded, not read (`_join_bounds`), unless the policy reads
    mean squares (`ApproxRange`), which a bound does not give."""
    measuring = None  # every step measures
    if state.built and state.measure_every_n_steps > 1 and not measures:
        measuring = tf.equal(state.counter("steps_until_measuring"), 0)
    return make_plan(
        loss,
        boundaries,
        list(state.trainable_variables),
        _entries.scaled(state),
        state.vector(),
        state.built,
        measuring,
        count_zeros=bool(state.estimate_underflow),
        bound_joins=not isinstance(state.policy, policies.ApproxRange),
        indices=state.indices,
    )


def make_plan(
    loss: tf.Tensor,
    boundaries: Sequence[_boundary.Boundary],
    variables: Sequence,
    owners: Sequence,
    scale_vector: tf.Tensor,
    built: bool,
    measuring: tf.Tensor | None = None,
    count_zeros: bool = False,
    bound_joins: bool = True,
    indices: Sequence = (),
) -> Plan:
    """Finds the scale components behind `loss` and reads their scales.

    Args:
        loss: The traced loss.
        boundaries: The boundaries the forward pass inserted (the step record's).
        variables: The optimizer's variables, in entry order (entry `1 + i`;
            entry 0 is the loss's).
        owners: `(owner, entry, name)` for every scaled layer.
        scale_vector: Every entry's current scale (float32 vector).
        built: Whether the scale variables exist yet (else `scale_vector` are
            first guesses and the step only unscales).
        measuring: Scalar bool: the step measures where it holds; None: every
            step measures; without `built`, no step does.
        count_zeros: Count zeros and subnormals too when measuring (telemetry).
        bound_joins: Bound the gradients crossing into joins from the others
            (`_join_bounds`) rather than reduce them.
        indices: Runtime indices to read each component's scale through
            (`_indices`); none: constant offsets.

    Returns:
        The frozen plan; `connect` it before backprop.
    """
    graph = loss.graph
    drafts, sides, component_of, reached = _drafts(loss, boundaries)
    loss_component = 0
    rows = {}
    if built and bound_joins:
        feeding = [c.feeding for c in drafts]
        rows = _join_bounds.rows(reached, sides, feeding, loss_component)
    drafts[loss_component].hold(0, "loss")
    _hold_entries(drafts, reached, sides, variables, owners, component_of)
    merged, final = _merge_by_entry(drafts)
    sides = {k: (final[a], final[o]) for k, (a, o) in sides.items()}
    scales = tf.gather(scale_vector, [c.entry for c in merged])
    each_scale = _indices.read_each(scales, indices)
    frozen = tuple(
        Component(c.entry, c.name, tuple(c.aliases), tuple(c.inside), tuple(c.feeding))
        for c in merged
    )
    return Plan(
        graph,
        frozen,
        scales,
        types.MappingProxyType({k: final[c] for k, c in component_of.items()}),
        types.MappingProxyType(sides),
        types.MappingProxyType(_factors(scales, each_scale, reached, sides, bool(indices))),
        final[loss_component],
        built,
        loss_finite=tf.reduce_all(tf.math.is_finite(loss)),
        measuring=measuring if built else None,
        crossings=_crossings.Crossings(
            graph, measuring, count_zeros, _join_bounds.Bounds(rows, scales, dict(sides))
        )
        if built
        else None,
        each_scale=each_scale,
    )


def _drafts(loss: tf.Tensor, boundaries: Sequence):
    """The draft components behind `loss` (the loss's first), each boundary's
    sides (id -> (input, output) draft), each captured variable handle's
    draft (id -> draft), and the boundaries reached, in the walk's order."""
    sets, label_of_op, reached = _walk(loss, list(boundaries))
    roots: dict[int, int] = {}
    drafts: list[_Draft] = []

    def component(label: int) -> int:
        root = sets.find(label)
        if root not in roots:
            roots[root] = len(drafts)
            drafts.append(_Draft())
        return roots[root]

    component(0)  # the loss's
    sides = {}
    for b, input_label, output_label in reached:
        a, o = component(input_label), component(output_label)
        sides[id(b)] = (a, o)
        drafts[a].feeding.append(b)
        drafts[o].inside.append(b)
    component_of = {}
    for external, internal in getattr(loss.graph, "captures", ()):
        label = label_of_op.get(internal.op.name)
        if label is not None:
            component_of[id(external)] = component(label)
    return drafts, sides, component_of, [b for b, _, _ in reached]


def _hold_entries(
    drafts: list[_Draft], reached: list, sides: dict, variables, owners, component_of
):
    """Gives every draft component its entry (and aliases) in the scale vector.

    A scaled layer's entry goes to the component its weights lie in (else
    the one its boundary opens); then every variable's entry to the
    component it lies in, so that any entry reads its variable's true scale
    (a layer with no boundary in this step, an Embedding of token ids,
    included). A component with no variables takes the scale its gradient
    arrives with; one that gets none, the loss's.
    """
    entry_of = {id(owner): (entry, name) for owner, entry, name in owners}

    def placed(owner) -> list[int]:
        """The components `owner`'s weights lie in."""
        handles = [id(w.handle) for w in owner.trainable_weights]
        return [component_of[h] for h in handles if h in component_of]

    for b in reached:
        if id(b.owner) in entry_of:
            lies_in = placed(b.owner)
            drafts[lies_in[0] if lies_in else sides[id(b)][1]].hold(*entry_of[id(b.owner)])
    names = {entry: name for _, entry, name in owners}
    for i, variable in enumerate(variables):
        component = component_of.get(id(variable.handle))
        if component is not None:
            drafts[component].hold(1 + i, names.get(1 + i, variable.path))
    changed = True
    while changed:
        changed = False
        for c in drafts:
            if c.entry is None:
                for b in c.feeding:
                    source = drafts[sides[id(b)][1]]
                    if source.entry is not None:
                        c.entry, c.name, changed = source.entry, source.name, True
                        break
    for c in drafts:
        if c.entry is None:
            c.entry, c.name = 0, "loss"


def _merge_by_entry(drafts: list[_Draft]) -> tuple[list[_Draft], list[int]]:
    """Merges the draft components one entry holds (they share its scale).

    Returns the merged components and, per draft, the index of its merged one.
    """
    merged: list[_Draft] = []
    index_of_entry: dict[int, int] = {}
    final = []
    for c in drafts:
        if c.entry not in index_of_entry:
            index_of_entry[c.entry] = len(merged)
            merged.append(_Draft(c.entry, c.name))
        group = merged[index_of_entry[c.entry]]
        group.aliases += [a for a in c.aliases if a not in group.aliases]
        group.inside += c.inside
        group.feeding += c.feeding
        final.append(index_of_entry[c.entry])
    return merged, final


def _factors(scales: tf.Tensor, each: tuple, reached: list, sides: dict, indexed: bool) -> dict:
    """The factor of every boundary that joins two components: the divisor
    (its output side's scale over its input side's) for one that `divides`,
    else the divisor's reciprocal: of two scales of `each` if they were read
    at runtime indices (XLA fuses the division into the rescaling, one kernel
    for the boundaries of one shape), else from one vector op (`_indices`)."""
    crossing = [(b, *sides[id(b)]) for b in reached if sides[id(b)][0] != sides[id(b)][1]]
    if not crossing:
        return {}
    over = [o if b.divides else a for b, a, o in crossing]
    under = [a if b.divides else o for b, a, o in crossing]
    if indexed:
        return {id(b): each[o] / each[u] for (b, _, _), o, u in zip(crossing, over, under)}
    values = tf.gather(scales, over) / tf.gather(scales, under)
    return {id(b): value for (b, _, _), value in zip(crossing, tf.unstack(values))}
