"""The program XLA compiles for a training step, counted and fingerprinted.

`python -m benchmarks.profiles step_program [--models a,b]` builds each model
(mixed_float16, `jit_compile=True`, Adam 1e-3, batch 8) under Keras's
`LossScaleOptimizer` and under keras_als on a wrapped copy, fits one epoch of
4 steps with XLA's dumps on, and reads the optimized program of the training
step (`*one_step_on_data*after_optimizations.txt`). For each it prints and
writes to `benchmarks/results/step_program.{json,md}`: the instructions, the
fusions and the conditionals of that program, the loss after the epoch, and a
fingerprint, the sha256 of the program with its names and source metadata
taken out.

Two commits whose fingerprints agree compile the same step: a change meant to
move code without changing what it computes (a refactor) can be checked so,
by running this command at both (for example in a `git worktree` of the
older one, with this file copied in). The counts say what keras_als adds to
the step's program, the cost study's measure of its size, and so is what
it writes out: the bytes of the buffers its entry's instructions produce.

A model of the cost study (`benchmarks.cost_at_size`: `densenet_4x4`,
`densenet121`, ...) is built and stepped once as that study does (SGD, batch
4, its inputs); `--ablation NAME` adds keras_als with that part left out
(`harness.ablations`), and `--out` writes elsewhere than the committed table:

    python -m benchmarks.profiles step_program --models densenet_4x4 --out /tmp/densenet
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402

from benchmarks.cost_at_size import measure as cost_measure  # noqa: E402
from benchmarks.cost_at_size import plan as cost_plan  # noqa: E402
from benchmarks.harness import ablations, hub_tasks, provenance, scaling, xla_memory, zoo  # noqa: E402
from benchmarks.real_models import programs  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.dirname(__file__)), "results", "step_program")
METHODS = ("keras_lso", "keras_als")


def _digits():
    x, y, _, _ = zoo.digits_data()
    return zoo.digits_cnn, x[:32], y[:32]


def _vit():
    x, y = hub_tasks.classification_data(32)
    return hub_tasks.vit_classifier, x, y


def _gpt2():
    x, y = hub_tasks.text_batches(32)
    return hub_tasks.gpt2_causal_lm, x, y


def _t5():
    x, y = hub_tasks.seq2seq_batches(32)
    return hub_tasks.t5_seq2seq_lm, x, y


MODELS = {"digits_cnn": _digits, "vit": _vit, "gpt2": _gpt2, "t5": _t5}
"""Each model's name and its (builder, x, y); KerasHub's tiny tasks of the harness."""


def normalized(program: str) -> str:
    """`program` (HLO text) without what names a thing rather than computes it:
    source metadata and attributes that quote names are dropped, and every
    `%name` becomes `%vN` in order of first appearance."""
    program = re.sub(r", metadata=\{[^}]*\}", "", program)
    program = re.sub(
        r", (op_name|source_file|frontend_attributes)=(\"[^\"]*\"|\{[^}]*\})", "", program
    )
    program = re.sub(r"^HloModule \S+", "HloModule step", program, flags=re.M)
    names: dict[str, str] = {}
    program = re.sub(
        r"%[\w.\-]+", lambda m: names.setdefault(m.group(0), f"%v{len(names)}"), program
    )
    return "\n".join(line.strip() for line in program.splitlines() if line.strip())


def counts(program: str) -> dict:
    """Instructions, fusions and conditionals of an HLO text, and its fingerprint."""
    text = normalized(program)
    instructions = [line for line in text.splitlines() if " = " in line]
    return {
        "instructions": len(instructions),
        "fusions": sum(" fusion(" in line for line in instructions),
        "conditionals": sum(" conditional(" in line for line in instructions),
        "written_bytes": programs.written_bytes(program),
        "fingerprint": hashlib.sha256(text.encode()).hexdigest()[:16],
    }


def dump_programs() -> str:
    """A new folder XLA dumps every program it compiles to, from now on in this
    process (XLA reads its flags at its first compile: call this before it)."""
    folder = tempfile.mkdtemp(prefix="step_program_")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} {xla_memory.dump_flags(folder)}".strip()
    return folder


def new_step_program(folder: str, seen: set[str], step: str = "one_step_on_data") -> str:
    """The largest optimized program of function `step` (Keras's training step
    by default) dumped to `folder` since `seen` (which it updates)."""
    found = set(glob.glob(os.path.join(folder, f"*{step}*after_optimizations.txt")))
    new = sorted(found - seen, key=os.path.getsize)
    seen |= found
    if not new:
        raise RuntimeError(f"XLA dumped no training step to {folder}; was it compiled before?")
    with open(new[-1]) as f:
        return f.read()


def measure(name: str, method: str, folder: str, seen: set[str]) -> dict:
    """One model under one method: its step program's counts and its loss."""
    build, x, y = MODELS[name]()
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(0)
    adaptive = method == "keras_als"
    inner = keras.optimizers.Adam(1e-3)
    model, optimizer = scaling.loss_scaled(build(), inner, wrap=adaptive, adaptive=adaptive)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=True)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
    keras.config.set_dtype_policy("float32")
    return {"model": name, "method": method, "loss": history.history["loss"][-1]} | counts(
        new_step_program(folder, seen)
    )


def measure_at_size(name: str, method: str, folder: str, seen: set[str]) -> dict:
    """A model of the cost study under `method` (`keras_lso`, `keras_als` or
    `keras_als:ABLATION`), stepped once as that study does."""
    study_method = "keras" if method == "keras_lso" else method
    model, _ = cost_measure.build(name, study_method)
    x, y = cost_plan.data(name)
    with ablations.named(method.partition(":")[2]):  # the step is traced here
        logs = keras.Model.train_on_batch(model, x, y, return_dict=True)
    keras.config.set_dtype_policy("float32")
    return {"model": name, "method": method, "loss": float(logs["loss"])} | counts(
        new_step_program(folder, seen)
    )


def _megabytes(count: int | None) -> str:
    return "not counted" if count is None else f"{count / 1e6:.1f}"


def render(saved: dict) -> str:
    """The markdown table of a saved run."""
    lines = [
        *provenance.header(
            saved,
            "The training step's compiled program: size and fingerprint",
            "benchmarks/profiles/step_program.py",
        ),
        "",
        "| model | method | instructions | fusions | conditionals | written (MB) "
        "| loss after its steps | fingerprint |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in saved["rows"]:
        lines.append(
            f"| {row['model']} | {row['method']} | {row['instructions']} | {row['fusions']} "
            f"| {row['conditionals']} | {_megabytes(row.get('written_bytes'))} "
            f"| {row['loss']:.6f} | `{row['fingerprint']}` |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    """Measures every model under both methods; prints and saves the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--ablation", default="", choices=["", *ablations.NAMED])
    parser.add_argument("--out", default=OUT, help="path without suffix")
    args = parser.parse_args(argv)
    names = args.models.split(",")
    at_size = (*cost_plan.MODELS, *cost_plan.SWEEP)
    unknown = [n for n in names if n not in MODELS and n not in at_size]
    if unknown:
        known = ", ".join([*MODELS, *at_size])
        parser.error(f"Unknown model {unknown[0]!r}; choose from {known}.")
    if args.ablation and any(n in MODELS for n in names):
        parser.error("--ablation takes models of the cost study only.")
    methods = METHODS + ((f"keras_als:{args.ablation}",) if args.ablation else ())
    folder, seen = dump_programs(), set()
    rows = [
        (measure if name in MODELS else measure_at_size)(name, method, folder, seen)
        for name in names
        for method in methods
    ]
    command = "python -m benchmarks.profiles step_program" + (f" {' '.join(argv)}" if argv else "")
    print(render(provenance.save(args.out, command, {"rows": rows}, render)))


if __name__ == "__main__":
    main()
