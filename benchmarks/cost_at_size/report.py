"""The cost study's tables: ratios to Keras LSO with standard errors, and the depth sweep."""

from __future__ import annotations

import math

from benchmarks.cost_at_size import plan
from benchmarks.harness.stats import ratio_and_standard_error

CAUSES = (
    "**Step, DenseNets.** Every layer's input is a concatenation of large feature maps. "
    "The gradients crossing into the concatenations are bounded rather than read "
    "(`keras_als/step/_join_bounds.py`; `--ablation joins_read` puts the reads back), and "
    "the gradients of convolutions' and concatenations' outputs are divided, written once, "
    "where a multiply by the reciprocal was copied into every kernel that reads them "
    "(`keras_als/step/_boundary.py`; DenseNet121 1.119 ± 0.023 with `--ablation "
    "feature_maps_multiplied`, in the same process as its row, 1.102 ± 0.032 in the "
    "row's latest run). What stays over Keras's "
    "is the other boundaries' reductions, whose branches cost on every step (their "
    "operands are written out), and the rescaling: on the depth sweep's DenseNet of 4 "
    "layers a block, without the rescaling 1.070x and without the crossing reductions "
    "1.100x, against 1.105x to 1.126x in one run or another, before the division "
    "(benchmarks/README.md). DenseNet169's and DenseNet201's steps under 1 are not taken "
    "apart.",
    "**First step, the depth sweep's DenseNets (1.19x to 1.33x).** XLA's compile of the "
    "crossing reductions' kernels: every layer of a DenseNet reads a concatenation of its "
    "own width, so no two layers' reductions share a kernel, as ViT-Base's twelve "
    "identical blocks do (`python -m benchmarks.profiles first_step --models densenet_1x4 "
    "--variants keras,keras_als,no_crossing_reductions`: 493 kernels against Keras's 295 "
    "and 341 without the reductions; XLA 8.1 s against 5.6 s and 5.1 s; trace 1.5 s "
    "against 0.8 s). On the real DenseNets Keras's own compile is the slower one (below).",
    "**First step, the study's models (0.39x to 1.09x).** TensorFlow lowers the traced "
    "step to XLA before XLA compiles it, and an `Abs` or an `IsNan` takes that lowering "
    "about 5 ms, whatever its size, where a `Maximum`, `Neg` or `NotEqual` takes well "
    "under 1 ms (`python -m benchmarks.profiles bridge_ops`). keras_als read each weight "
    "gradient's largest magnitude through both, about 205 of each on ViT-Base; it now "
    "reads `maximum(g, -g)` and `g != g` (`keras_als/step/_reductions.py`). ViT-Base's "
    "first step read 1.251 ± 0.071 before, 1.019 ± 0.026 after, and 1.092 ± 0.020 in a "
    "second run of the same code; the Llama-shaped decoder's 1.298 before, 1.086 after; "
    "BERT-Base's 1.137 before, 0.973 after. Each layer's scale is read at an index XLA "
    "cannot see (`keras_als/step/_indices.py`), so the updates and rescalings of layers "
    "of one shape share a kernel, as Keras's repeated blocks do. These ratios are of "
    "`train_on_batch`, where Keras's optimizer, built inside the first trace, makes "
    "TensorFlow trace the step twice and keras_als's once, since it makes its scale "
    "variables ahead (`keras_als/step/_early_build.py`). Like for like, both optimizers "
    "built before the step (`python -m benchmarks.profiles first_step --models vit_base "
    "--variants keras,keras_als`), ViT-Base's first step is 1.39x of Keras's in one run: "
    "lowering to XLA 1.90 s against 2.09 s, trace 3.16 s against 2.35 s, and XLA's "
    "compile 6.65 ± 1.01 s against 3.96 ± 0.05 s (255 kernels against 161), which is "
    "most of what keras_als adds. Between runs Keras's own first step moves: ViT-Base's "
    "read 11.5 s and 12.8 s in the two runs above, 14.0 s and 12.2 s in earlier ones.",
    "**First step under 1 on the deepest nets.** Keras's optimizer applies the updates "
    "under a conditional on every gradient being finite, which XLA turns into selects: each "
    "update kernel then computes the predicate from every gradient's finiteness, so its "
    "compile grows as the square of the variables; keras_als's predicate is one buffer "
    "(`python -m benchmarks.profiles update_fusions`).",
    "**Peak step memory, Swin-T.** The programs allocate the same (429.1 and 429.4 MB); "
    "XLA's peak counts 419.6 MB of Keras's live at once and 428.5 MB of keras_als's: the "
    "schedule holds more of its buffers live together, the allocation did not grow (`python -m "
    "benchmarks.profiles peak_buffers --models swin_tiny`).",
    "**Step, 1.02x to 1.05x** (DenseNet121 1.046, MobileNetV3Small 1.040, ConvNeXtTiny "
    "1.032, GPT-2 1.029, EfficientNetB3 1.024; GPT-2 read 1.060 ± 0.015 in the run "
    "before). Between runs a ratio moves by more than its standard error, which counts "
    "the spread within one process: MobileNetV3Large's read 1.040 ± 0.033, then 1.007 ± "
    "0.009 on the same machine and code, and the sweep's DenseNet of 8 layers a block "
    "1.048 ± 0.005, then 1.093 ± 0.028. It moves between machines too: GPT-2's read 1.021"
    " ± 0.001 at commit 9a4baa7, on a CPU not recorded, where Keras's step took 1.08 s, "
    "against 1.33 s (1.52 s in the run before) on the AMD EPYC of the current row. The "
    "rows of commits 8c44fbe, 721033b and 8259c98 ran on that one machine, an AMD EPYC "
    "without avx512_fp16; where the rows of 9a4baa7, aa8c0c3 and 5561d89 ran was not "
    "recorded. On ConvNeXtTiny keras_als's kernels take no longer than Keras's; its "
    "program waits longer between them, at one measuring branch per crossing gradient "
    "(`python -m benchmarks.profiles step_profile --models convnext_tiny --instances 1`)."
    " Reduced in one branch after backprop instead, its step took 1.015 ± 0.005 in one "
    "run and 1.031 ± 0.008 in the next, beside keras_als's 1.032 ± 0.009 (`--ablation "
    "crossings_reduced_last`): no gain that holds. Under the profiler (`python -m "
    "benchmarks.profiles step_profile --models mobilenet_v3_small,gpt2_base --instances "
    "1`), keras_als's step is 0.7% over Keras's on MobileNetV3Small (+0.58 ms: TensorFlow's "
    "call of the compiled step +1.08 ms, for the variables it adds, and the program -0.88 "
    "ms) and 0.9% on GPT-2 (+11.2 ms of 1,281 ms: the program's convert fusions +62.7 ms, "
    "less Keras's finiteness kernels, 34.0 ms, and its matrix products, 23.0 ms faster), "
    "where the wrapped model with Keras's optimizer, whose program is Keras's, differs from "
    "Keras's by -3.7% and -0.2%. On MobileNetV3Small what the study reads over 1.02 is "
    "within what two compiled instances of one program differ by; on GPT-2 the profile's "
    "0.9% is keras_als's, and the study's ratio moved between runs (1.021, 1.060, 1.029) "
    "by more than that. On EfficientNetB3 (`step_profile --models efficientnet_b3 "
    "--instances 1`) keras_als's step is 2.7% over Keras's, the wrapped model with "
    "Keras's optimizer 0.9%: the boundaries' rescaling of feature maps' gradients, between "
    "its 209 scales (the divide, add-convert and convert-multiply fusions, +10.0 ms of "
    "947 ms), TensorFlow's call of the step (+2.2 ms, +1.1 ms for the wrapped model), "
    "and the convolutions (+6.9 ms) and depthwise convolutions (+4.0 ms), which moved by "
    "1.3 ms and 1.7 ms between instances of Keras's own program.",
)
"""Why a ratio is beyond its target, each with the command that shows it."""


def ratios(row: dict, method: str = "keras_als") -> dict:
    """`method` over Keras LSO per measure: `{measure: (ratio, standard error)}`."""
    found = {}
    for measure in ("step", "first_step", "peak_bytes"):
        ours, theirs = row[measure].get(method, []), row[measure]["keras"]
        if all(v is not None for v in ours + theirs) and ours and theirs:
            found[measure] = ratio_and_standard_error(ours, theirs)
    return found


def _cell(pair, target: float | None) -> str:
    if pair is None:
        return "-"
    ratio, error = pair
    text = f"{ratio:.3f}" + (f" ± {error:.3f}" if math.isfinite(error) else "")
    return f"**{text}**" if target is not None and ratio > target else text


def _geometric_mean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _cpu(row: dict) -> str:
    return f"on {row['cpu']}" if row.get("cpu") else "CPU not recorded"


def line(row: dict) -> str:
    """One line for the console."""
    found = ratios(row)
    parts = [f"{m} {found[m][0]:.3f} ± {found[m][1]:.3f}" for m in found]
    return f"{row['model']} ({row['scales']} scales): " + ", ".join(parts)


def render(results: dict) -> str:
    rows = results["rows"]
    targets = plan.TARGETS
    lines = [
        "## Cost at real size",
        "",
        "Each model in a process of its own, `python -m benchmarks.cost_at_size --models "
        f"NAME`; last written {results['date']}; {results['environment']}.",
        "",
        f"mixed_float16, `jit_compile=True`, SGD, batch {plan.BATCH}, {plan.IMAGE}x{plan.IMAGE} "
        f"images or {plan.SEQUENCE} tokens; {plan.INSTANCES} compiled instances of each method "
        f"per model in one process; steps after {plan.WARMUP} warm-up steps, {plan.ROUNDS} "
        "interleaved rounds. keras_als over Keras LSO (geometric mean ± standard error over "
        "the instances); in bold, over the target (step "
        f"{targets['step']}, first step {targets['first_step']}, peak {targets['peak_memory']}). "
        "Rows measured on different CPUs (listed at the end) differ in Keras's own times, "
        "and may in their ratios.",
        "",
        "| model | scales | step | Keras step (ms) | first step | Keras first step (s) "
        "| peak step memory |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        found = ratios(row)
        keras_step = 1000 * _geometric_mean(row["step"]["keras"])
        keras_first = _geometric_mean(row["first_step"]["keras"])
        lines.append(
            f"| {row['model']} | {row['scales']} | {_cell(found.get('step'), targets['step'])} "
            f"| {keras_step:.0f} | {_cell(found.get('first_step'), targets['first_step'])} "
            f"| {keras_first:.0f} | {_cell(found.get('peak_bytes'), targets['peak_memory'])} |"
        )
    ablated = [(row, m) for row in rows for m in row["step"] if ":" in m]
    if ablated:
        lines += [
            "",
            "keras_als with one part left out (`--ablation`), over Keras LSO, same process:",
            "",
            "| model | left out | step | first step | peak step memory |",
            "| --- | --- | --- | --- | --- |",
        ]
        for row, method in ablated:
            found = ratios(row, method)
            cells = [_cell(found.get(m), None) for m in ("step", "first_step", "peak_bytes")]
            lines.append(
                f"| {row['model']} | {method.partition(':')[2]} | " + " | ".join(cells) + " |"
            )
    lines += ["", "Why a ratio is where it is:", "", *(f"- {cause}" for cause in CAUSES)]
    missing = [n for n in [*plan.MODELS, *plan.SWEEP] if n not in {r["model"] for r in rows}]
    if missing:
        lines += ["", "Not measured yet: " + ", ".join(missing) + "."]
    lines += [
        "",
        "Code and CPU measured per row: "
        + "; ".join(f"{r['model']} {r['provenance']}, {_cpu(r)}" for r in rows)
        + ".",
    ]
    return "\n".join(lines) + "\n"
