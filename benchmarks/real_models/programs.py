"""What each method's step is made of: traced operations, compiled kernels, HLO."""

from __future__ import annotations

import math
import re
from collections import Counter

import keras
import tensorflow as tf

from benchmarks.real_models.architectures import build, data
from benchmarks.real_models.breakdown import traced_as
from benchmarks.real_models.probes import FUSED_VARIANTS


def graph_ops(name: str) -> dict:
    """Operations in each method's traced training step, those of the functions it
    calls (branches) included: what tracing builds and XLA compiles.

    The step is a custom one, as `model.fit` runs it (forward pass, `scale_loss`,
    gradient, `apply`), traced once with the optimizer already built.
    """
    x, y = data(name, 1)
    counts = {}
    for method in ("keras", "keras_als"):
        keras.utils.clear_session()
        model, optimizer = build(name, method)
        optimizer.build(model.trainable_variables)
        counts[method] = _operations_of_step(model, optimizer, x, y)
    return counts


def step_kernels(name: str) -> dict:
    """Kernels the XLA-compiled step of each method runs on every step (`kernels_of`),
    and whether the wrapped model with Keras's optimizer compiles to the plain
    model's program (`same_program`): then whatever the wrapper alone seems to
    cost in a step time is the measurement's noise.

    On a CPU each kernel has a fixed cost besides its work, so on a short step
    this count tells what the step time cannot resolve. The size of each
    whole program (`instructions_of`, `fusions_of`, branches included) is
    what XLA compiles: the compile time grows with it. The fusions of the
    compile breakdown's `probes.FUSED_VARIANTS` are counted too: what each
    part adds to the program XLA compiles.
    """
    plain = compiled_step(name, "keras")
    ours = compiled_step(name, "keras_als")
    counts = {
        "keras": kernels_of(plain),
        "keras_als": kernels_of(ours),
        "wrapper_only_same_program": same_program(plain, compiled_step(name, "keras", wrap=True)),
        "instructions": {"keras": instructions_of(plain), "keras_als": instructions_of(ours)},
        "fusions": {"keras": fusions_of(plain), "keras_als": fusions_of(ours)}
        | {variant: fusions_of(compiled_variant(name, variant)) for variant in FUSED_VARIANTS},
        "for_branches_only": {
            "keras": len(for_branches_only(plain)),
            "keras_als": len(for_branches_only(ours)),
        },
    }
    return counts


def unoptimized_by_origin(name: str, top: int = 10) -> dict:
    """Instructions of each method's step as it hands it to XLA (HLO before
    XLA's optimizations, branches included), and keras_als's extra ones by the
    TensorFlow operation they come from (`origins_of`), most first: what XLA
    compiles more of. The first step's time grows with it, not in proportion
    (`--parts graph,compile` prints both)."""
    plain = origins_of(compiled_step(name, "keras", stage="hlo"))
    ours = origins_of(compiled_step(name, "keras_als", stage="hlo"))
    extra = {key: ours[key] - plain[key] for key in set(ours) | set(plain)}
    return {
        "instructions": {"keras": sum(plain.values()), "keras_als": sum(ours.values())},
        "extra_by_origin": sorted(extra.items(), key=lambda item: -abs(item[1]))[:top],
    }


def origins_of(hlo: str) -> Counter:
    """Instructions of HLO text by the TensorFlow operation they come from: the
    `op_name` of their metadata, the first and last of its scopes (`cond/Mean`
    for `cond_3/Mean_2`; `gradient_tape/.../mul` for a product inside a
    layer's gradient), without the numbers TensorFlow appends to names.
    Instructions without one (a computation's parameters, the tuples that
    carry a conditional's operands) count under `(none)`."""
    counts = Counter()
    for line in hlo.splitlines():
        right = line.partition(" = ")[2]
        if _opcode(right):
            found = re.search(r'op_name="([^"]*)"', right)
            counts[_origin(found.group(1)) if found else "(none)"] += 1
    return counts


def _origin(op_name: str) -> str:
    scopes = [re.sub(r"_\d+$", "", scope) for scope in op_name.split("/")]
    return f"{scopes[0]}/.../{scopes[-1]}" if len(scopes) > 2 else "/".join(scopes)


def compiled_step(
    name: str, method: str, wrap: bool | None = None, stage: str = "optimized_hlo"
) -> str:
    """The HLO text of model `name`'s XLA-compiled training step with `method`'s
    optimizer (the model wrapped as `build` says), not run: after XLA's
    optimizations (`stage="optimized_hlo"`), or as the step hands it to XLA
    (`stage="hlo"`, four times faster to get for MobileNetV3Small)."""
    x, y = data(name, 1)
    x, y = keras.tree.map_structure(tf.constant, (x, y))
    keras.utils.clear_session()
    model, optimizer = build(name, method, wrap=wrap)
    optimizer.build(model.trainable_variables)
    step = _step_function(model, optimizer, jit_compile=True)
    return step.experimental_get_compiler_ir(x, y)(stage=stage)


def compiled_variant(name: str, variant: str) -> str:
    """The optimized HLO text of compile variant `variant`'s step (`traced_as`)."""
    method, wrap, ablation = traced_as(variant)
    with ablation:
        return compiled_step(name, method, wrap=wrap)


def same_program(hlo: str, other: str) -> bool:
    """Whether two HLO texts are one program, up to names, the order of its
    parameters and instructions whose results nothing reads: the same
    computations called from the entry, instruction for instruction, and the
    same instructions in the entry computation, in any order. Names are
    replaced by their order of first appearance, and the metadata (which names
    the Keras layers) is left out. An instrumented model may pass its
    variables in another order (its hooks read a layer's non-trainable state
    before calling it), which renumbers the entry's parameters and nothing
    else. Unread instructions are what XLA removes first (dead code
    elimination): the HLO a step hands XLA holds some (the zeros TensorFlow
    makes for gradients nobody reads), its optimized HLO none."""
    return _program_of(hlo) == _program_of(other)


def _program_of(hlo: str) -> tuple[list[str], list[str]]:
    """(the computations before the entry, names renumbered; the entry's
    instructions that are read, names and parameter numbers left out, sorted)."""
    called, entry = hlo.split("\nENTRY", 1)
    names = {}

    def renamed(match):
        return names.setdefault(match.group(0), f"%{len(names)}")

    computations = [
        re.sub(r"%[\w.\-]+", renamed, _without_metadata(line))
        for line in called.splitlines()
        if not line.startswith("HloModule")
    ]
    read = _read_lines(entry.splitlines()[1:])
    instructions = sorted(_root_sorted(_anonymous(line)) for line in read)
    return computations, instructions


def _read_lines(lines: list[str]) -> list[str]:
    """The instruction lines of a computation whose results are read, by the
    root or by another read instruction (dead code elimination)."""
    defined = {}
    for line in lines:
        name, equals, right = line.strip().removeprefix("ROOT ").partition(" = ")
        if equals:
            defined[name] = (line, re.findall(r"%[\w.\-]+", _without_metadata(right)))
    roots = [name for name, (line, _) in defined.items() if line.lstrip().startswith("ROOT")]
    read, waiting = set(), roots
    while waiting:
        name = waiting.pop()
        if name in read or name not in defined:
            continue
        read.add(name)
        waiting.extend(defined[name][1])
    return [line for name, (line, _) in defined.items() if name in read]


def _anonymous(line: str) -> str:
    """An entry instruction without its metadata, names or parameter number."""
    line = re.sub(r"%[\w.\-]+", "%", _without_metadata(line))
    return re.sub(r"parameter\(\d+\)", "parameter", line)


def _root_sorted(line: str) -> str:
    """The entry's result, a tuple of the updated variables, with its shapes
    sorted (they follow the parameters' order)."""
    if not line.lstrip().startswith("ROOT"):
        return line
    return " ".join(sorted(re.findall(r"\w+\[[^\]]*\](?:\{[^}]*\})?", line)))


def _without_metadata(line: str) -> str:
    return re.sub(r",? metadata=\{[^}]*\}", "", line)


NOT_KERNELS = frozenset(
    ["parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all"]
)
"""HLO instructions that launch no work of their own."""


def kernels_of(hlo: str) -> int:
    """Instructions of optimized HLO text's entry computation that run work
    (fusions, matrix products, copies, conditionals, ...): the kernels of every
    step (what a conditional's branches hold is not counted: it may not run)."""
    count = 0
    for line in _entry_lines(hlo):
        _, _, right = line.partition(" = ")
        opcode = _opcode(right)
        count += bool(opcode) and opcode not in NOT_KERNELS
    return count


ITEM_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "s32": 4, "u32": 4, "s64": 8, "pred": 1}


def written_bytes(hlo: str) -> int:
    """Bytes of the buffers optimized HLO text's entry instructions produce:
    those of `kernels_of` but its conditionals, whose outputs their branches write."""
    total = 0
    for line in _entry_lines(hlo):
        _, _, right = line.partition(" = ")
        opcode = _opcode(right)
        if not opcode or opcode in NOT_KERNELS or opcode == "conditional":
            continue
        shape = right[: right.index(f" {opcode}(")]
        for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shape):
            total += ITEM_BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(",") if d)
    return total


def for_branches_only(hlo: str) -> list[str]:
    """Kernels of optimized HLO text's entry computation whose results only
    conditionals read (directly or through the tuples of their operands): work
    every step does to hand a branch its operands, whether the branch runs or not.

    On a CPU, XLA computes a float16 matrix product in float32 and rounds its
    result inside each consumer's kernel; a branch that reduces the float16
    gradient needs it as a buffer, so one more kernel writes it, on every step.
    """
    defined, readers = {}, {}
    for line in _entry_lines(hlo):
        name, _, right = line.strip().removeprefix("ROOT ").partition(" = ")
        right = right.split(", metadata=")[0]
        defined[name] = right
        for operand in re.findall(r"%[\w.\-]+", right.partition("(")[2]):
            readers.setdefault(operand, []).append(name)
    branch_operands = set()
    for name, right in defined.items():
        if _opcode(right) == "conditional":
            branch_operands.add(name)
            branch_operands.update(re.findall(r"%[\w.\-]+", right.partition("(")[2])[1:])
    tuples = {n for n in branch_operands if _opcode(defined.get(n, "")) == "tuple"}
    return [
        name
        for name, right in defined.items()
        if _opcode(right) not in NOT_KERNELS
        and _opcode(right) != "conditional"
        and readers.get(name)
        and all(r in tuples or _opcode(defined[r]) == "conditional" for r in readers[name])
    ]


def _entry_lines(hlo: str) -> list[str]:
    """The instruction lines of optimized HLO text's entry computation."""
    entry = hlo[hlo.index("\nENTRY") + 1 :]
    return entry[: entry.index("\n}")].splitlines()[1:]


def instructions_of(hlo: str) -> int:
    """Instructions of optimized HLO text, in every computation (branches and
    fused computations included)."""
    lines = [line.partition(" = ")[2] for line in hlo.splitlines() if " = " in line]
    return sum(bool(_opcode(line)) for line in lines)


def fusions_of(hlo: str) -> int:
    """Fusion instructions of optimized HLO text: the kernels XLA generates code for."""
    return sum(
        _opcode(line.partition(" = ")[2]) == "fusion" for line in hlo.splitlines() if " = " in line
    )


def _opcode(instruction: str) -> str:
    """The opcode of an HLO instruction's right-hand side: `shape opcode(operands)`,
    where the shape may be a tuple in parentheses."""
    depth, start = 0, 0
    if instruction.startswith("("):  # a tuple shape: skip to its closing parenthesis
        for i, char in enumerate(instruction):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                start = i + 1
                break
    before, parenthesis, _ = instruction[start:].partition("(")
    words = before.split()
    return words[-1] if parenthesis and words else ""


def _step_function(model, optimizer, jit_compile: bool = False):
    """One training step of `model` and `optimizer`, as `model.fit` runs it
    (forward pass, `scale_loss`, gradient, `apply`), as a `tf.function`."""

    @tf.function(jit_compile=jit_compile)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True), sample_weight=None)
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)

    return step


def _operations_of_step(model, optimizer, x, y) -> int:
    """Operations of one traced training step of `model` and `optimizer`, branches included."""
    graph = _step_function(model, optimizer).get_concrete_function(x, y).graph.as_graph_def()
    return len(graph.node) + sum(len(f.node_def) for f in graph.library.function)
