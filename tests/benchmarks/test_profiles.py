"""The profiles (benchmarks/profiles): the wrap sweep and the step and trace
profiles, on tiny models or synthetic traces."""

import pytest


def test_the_wrap_sweep_builds_tiny_backbones_and_says_what_a_constructor_lacks():
    pytest.importorskip("keras_hub")
    from benchmarks.profiles import wrap_sweep

    backbone = wrap_sweep.tiny_backbone("LlamaBackbone")
    assert (backbone.num_layers, backbone.hidden_dim, backbone.num_key_value_heads) == (2, 32, 1)
    with pytest.raises(TypeError, match=r"CLIPBackbone needs \['vision_encoder'"):
        wrap_sweep.tiny_backbone("CLIPBackbone")


def test_the_wrap_sweep_row_of_a_small_model_keeps_its_weights_and_has_both_skip_counts():
    import keras

    from benchmarks.profiles import wrap_sweep

    def make(input_scale=None):
        inputs = keras.Input((8, 8, 3))
        x = inputs if input_scale is None else keras.layers.Rescaling(input_scale)(inputs)
        hidden = keras.layers.Conv2D(4, 3, activation="relu")(x)
        pooled = keras.layers.GlobalAveragePooling2D()(hidden)
        return keras.Model(inputs, keras.layers.Dense(10, dtype="float32")(pooled))

    row = wrap_sweep.try_model(make, steps=3)
    assert row["weights_equal"] and row["outputs_equal"] and row["warnings"] == 0
    assert row["scales"] == 3  # the loss, the convolution, the head
    # Standard-normal inputs through three small layers: every gradient times either
    # optimizer's first scale (2^15) stays finite in float16, so no step is skipped.
    assert (row["keras"], row["keras_als"]) == (0, 0)
    assert row["weights_not_finite"] == {"keras": 0, "keras_als": 0}
    # The count can see a skip: inputs times 10^4 make the convolution's float16
    # gradient overflow on all three steps at either optimizer's scales.
    spiked = wrap_sweep.try_model(lambda: make(input_scale=1e4), steps=3)
    assert (spiked["keras"], spiked["keras_als"]) == (3, 3)
    assert spiked["weights_not_finite"] == {"keras": 0, "keras_als": 0}
    table = wrap_sweep.markdown({"small": row, "broken": {"error": "keras_als: ValueError"}}, 3)
    assert f"| small | True | True | 0 | 3 | {row['keras']} / {row['keras_als']} | 0 / 0 |" in table
    assert "| broken |  |  | | | keras_als: ValueError | |" in table


def _xspace(lines: dict[str, list[tuple[str, float, float]]]):
    """An XSpace with one plane and, per line, events `(name, start us, end us)`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ids = {}
    for k, (line_name, events) in enumerate(lines.items()):
        line = plane.lines.add(id=k, name=line_name, timestamp_ns=0)
        for name, start, end in events:
            if name not in ids:
                ids[name] = len(ids) + 1
                plane.event_metadata[ids[name]].id = ids[name]
                plane.event_metadata[ids[name]].name = name
            line.events.add(
                metadata_id=ids[name],
                offset_ps=int(start * 1e6),
                duration_ps=int((end - start) * 1e6),
            )
    return space


def test_the_step_profile_splits_a_step_into_python_launch_program_and_kernel_kinds():
    from benchmarks.profiles import step_profile

    space = _xspace(
        {
            "main": [
                ("step:keras_als/0", 0, 1000),
                ("one_step_on_data", 50, 950),  # Python's trace, not a kernel
                ("EagerLocalExecute: __inference_one_step_on_data_12", 100, 900),
                (step_profile.PROGRAM, 200, 800),
                ("convert_multiply_fusion.3", 250, 350),
                ("cond.2", 400, 600),
                ("add_fusion.7", 450, 500),  # inside the branch
                ("dot.4", 650, 750),
                ("MatMul", 660, 740),  # the dot's library call: the dot's own time
                ("fusion.9", 960, 990),  # after the program: not counted
            ],
            "worker": [("convert_multiply_fusion.5", 300, 320)],
        }
    )
    (step,) = step_profile.split(space)["keras_als/0"]
    expected = {
        "step": 1000,
        "launch": 200,  # 800 in the call, 600 of them the program's
        "program": 600,
        "python": 200,
        "kernel:convert_multiply_fusion": 120,  # both lines
        "kernel:cond": 150,
        "kernel:add_fusion": 50,
        "kernel:dot": 100,
    }
    assert step == pytest.approx(expected, abs=1e-6)


def test_the_step_profile_compares_each_variant_with_keras_over_instances():
    from benchmarks.profiles import step_profile

    steps = {}
    for k, offset in enumerate((0.0, 40.0)):  # two instances of each
        for v, extra in zip(step_profile.VARIANTS, (0.0, 100.0, 10.0, 30.0)):
            steps[f"{v}/{k}"] = [
                {"step": 1000 + offset + extra + d, "python": 300, "launch": 200, "program": 500}
                for d in (-5, 0, 50)
            ]
    summary = step_profile.summarize(steps, 2)
    assert summary["us"]["keras"]["step"] == pytest.approx(1020.0)  # medians 1000 and 1040
    assert summary["difference_us"]["keras_als"]["step"] == pytest.approx(100.0)
    assert summary["difference_us"]["optimizer_only"]["step"] == pytest.approx(30.0)
    assert summary["keras_spread_us"]["step"] == pytest.approx(40.0)
    table = step_profile.markdown({"models": {"gpt2_tiny": summary}})
    assert "| step | 1020 | +100 | +10 | +30 | 40 |" in table
    assert "| launch | 200 | +0 | +0 | +0 | 0 |" in table


def test_the_step_profile_builds_a_cost_study_model_as_that_study_does(monkeypatch):
    """A model of the cost study is built by the study's builder for each
    variant: wrapped or not, and under the optimizer the variant names; its
    batch is the study's."""
    import keras

    import keras_als
    from benchmarks.cost_at_size import measure, plan
    from benchmarks.profiles import step_profile

    monkeypatch.setattr(measure, "warm_up_process", lambda: None)
    monkeypatch.setattr(plan, "WARMUP", 0)
    x, y, warmed_up = step_profile._at_size("densenet_1x4")
    assert x.shape[0] == plan.BATCH and len(y) == plan.BATCH
    expected = {
        "keras": (False, keras.optimizers.LossScaleOptimizer),
        "keras_als": (True, keras_als.AdaptiveLossScaleOptimizer),
        "wrapper_only": (True, keras.optimizers.LossScaleOptimizer),
        "optimizer_only": (False, keras_als.AdaptiveLossScaleOptimizer),
    }
    for variant, (wrapped, optimizer) in expected.items():
        model = warmed_up(**step_profile.VARIANTS[variant])
        hooks = [keras_als.instrument.hook_of(layer) for layer in model._flatten_layers()]
        assert any(h is not None for h in hooks) == wrapped, variant
        assert type(model.optimizer) is optimizer, variant
    keras.config.set_dtype_policy("float32")


def test_the_trace_profile_splits_a_first_step_and_counts_keras_als_s_branches(capsys, monkeypatch):
    """A tiny GPT-2's first step without XLA, for both methods: the time in
    TensorFlow's runtime is found (else `graph` reads 0), keras_als's step
    builds more conditionals than Keras's apply-or-skip, and only its profile
    lists keras_als's functions."""
    from benchmarks.profiles import trace_profile

    rows = {m: trace_profile.first_step("gpt2_tiny", m, top=3) for m in trace_profile.METHODS}
    for row in rows.values():
        assert 0 < row["graph"] < row["seconds"] and row["trace"] > 0, row
    assert rows["keras"]["conditionals"] >= 1
    assert rows["keras_als"]["conditionals"] > rows["keras"]["conditionals"], rows
    assert rows["keras"]["keras_als"] == [] and len(rows["keras_als"]["keras_als"]) == 3
    printed = trace_profile.table("gpt2_tiny", rows)
    assert "| keras_als |" in printed and "_apply_phases.py:run" in printed
    profiled = []
    monkeypatch.setattr(trace_profile, "first_step", lambda *args: profiled.append(args))
    with pytest.raises(SystemExit):
        trace_profile.main(["--models", "gpt2_tiny,vgg16"])
    assert "Unknown model 'vgg16'" in capsys.readouterr().err
    assert profiled == []  # refused before profiling the valid name given first


def _quoted_margin_skips(text):
    """The skip counts quoted after 'margins 1, 2, ... and 8 skipped', as floats."""
    import re

    flat = " ".join(text.split())
    found = re.search(r"skipped ((?:[\d.]+, )+[\d.]+ and [\d.]+) steps a run", flat)
    assert found, "no quoted margin sweep"
    return [float(v) for v in re.split(r", | and ", found.group(1))]


def test_the_default_margin_s_justification_quotes_the_committed_margin_sweep():
    """The skip counts in the policies guide and in `MaxSafe`'s docstring are
    the committed `margin_sweep.json`'s means per margin, to one decimal, and
    the default margin is the smallest at which no seed skipped."""
    import json
    import pathlib
    import statistics

    import keras_als

    root = pathlib.Path(__file__).resolve().parents[2]
    saved = json.loads((root / "benchmarks/results/margin_sweep.json").read_text())
    means = []
    for margin in saved["margins"]:
        skipped = [r["skipped"] for r in saved["runs"] if r["margin"] == margin]
        means.append(round(statistics.mean(skipped), 1))
    for text in (
        (root / "docs/guide/policies.md").read_text(),
        keras_als.policies.MaxSafe.__doc__,
    ):
        assert _quoted_margin_skips(text) == means
    clean = [
        m
        for m in saved["margins"]
        if all(r["skipped"] == 0 for r in saved["runs"] if r["margin"] == m)
    ]
    assert min(clean) == keras_als.policies.MaxSafe().margin == 6


STEP = """HloModule a_inference_one_step_on_data_3474__.54, entry_computation_layout={()->f32[]}

%fused_computation.7 (param_0.1: f32[2]) -> f32[2] {
  %param_0.1 = f32[2]{0} parameter(0)
  ROOT %multiply.3 = f32[2]{0} multiply(%param_0.1, %param_0.1), metadata={op_name="mul"}
}

ENTRY %main.9 (Arg_0.1: f32[2]) -> f32[] {
  %Arg_0.1 = f32[2]{0} parameter(0)
  %fusion.2 = f32[2]{0} fusion(%Arg_0.1), kind=kLoop, calls=%fused_computation.7
  %constant.5 = f32[] constant(0)
  ROOT %reduce.6 = f32[] reduce(%fusion.2, %constant.5), dimensions={0}, to_apply=%add.1
}
"""


def test_the_step_program_fingerprint_ignores_names_and_metadata_and_sees_any_other_change():
    """Renamed instructions, computations and module, or other source
    metadata, give the same fingerprint and counts; another opcode or
    constant gives another fingerprint. The bytes written count the buffers
    the entry's instructions produce, not its parameters and constants."""
    from benchmarks.profiles import step_program

    renamed = (
        STEP.replace("%fusion.2", "%fusion.99")
        .replace("fused_computation.7", "fused_computation.1")
        .replace("3474__.54", "17077__.191")
        .replace('op_name="mul"', 'op_name="model/dense/mul"')
    )
    counted = step_program.counts(STEP)
    assert counted == step_program.counts(renamed)
    assert (counted["instructions"], counted["fusions"], counted["conditionals"]) == (6, 1, 0)
    assert counted["written_bytes"] == 8 + 4  # the fusion's f32[2] and the reduction's f32[]
    for changed in (STEP.replace("multiply(", "add("), STEP.replace("constant(0)", "constant(1)")):
        assert step_program.counts(changed)["fingerprint"] != counted["fingerprint"]


def test_the_first_step_profile_counts_fusions_equal_but_for_names_as_one_kernel():
    from benchmarks.profiles import first_step

    def fusion(name, offset):
        return (
            f"%{name} (p.{offset}: f32[8], q.{offset}: f32[4]) -> f32[8] {{\n"
            f"  %p.{offset} = f32[8]{{0}} parameter(0)\n"
            f"  %q.{offset} = f32[4]{{0}} parameter(1)\n"
            f"  %s.{offset} = f32[1]{{0}} slice(%q.{offset}), slice={{[{offset}:{offset + 1}]}}\n"
            f"  %b.{offset} = f32[] bitcast(%s.{offset})\n"
            f"  %r.{offset} = f32[8]{{0}} broadcast(%b.{offset}), dimensions={{}}\n"
            f"  ROOT %m.{offset} = f32[8]{{0}} multiply(%p.{offset}, %r.{offset})\n"
            "}\n"
        )

    # Two fusions that slice the same offset compute the same thing under other
    # names: one kernel. A third slicing another offset is a kernel of its own.
    program = (
        fusion("fused_computation", 0)
        + fusion("fused_computation.1", 0).replace("p.0", "x.7").replace("q.0", "y.7")
        + fusion("wrapped_multiply_computation", 2)
        + "ENTRY %main (a: f32[8]) -> f32[8] {\n  ROOT %a = f32[8]{0} parameter(0)\n}\n"
    )
    assert first_step.kernels(program) == (3, 2)


def test_the_first_step_profile_counts_the_operations_of_nested_functions_once():
    import tensorflow as tf

    from benchmarks.profiles import first_step

    @tf.function
    def flat(x):
        return x * 2.0 + 1.0

    @tf.function
    def branching(x):
        return tf.cond(x > 0, lambda: x * 2.0 + 1.0, lambda: x - 1.0)

    spec = tf.TensorSpec([], tf.float32)
    flat_count = first_step.operations(flat.get_concrete_function(spec).graph)
    # x, 2, mul, 1, add, identity of the result.
    assert flat_count == 6
    branching_count = first_step.operations(branching.get_concrete_function(spec).graph)
    # The branches' operations are counted beside the outer graph's.
    outer = len(branching.get_concrete_function(spec).graph.get_operations())
    assert branching_count > outer + 5


def test_the_first_step_profile_table_gives_each_total_over_keras():
    from benchmarks.profiles import first_step

    def row(variant, seconds):
        parts = {p: seconds / 4 for p in first_step.PARTS}
        spreads = {f"{p}_spread": 0.01 for p in first_step.PARTS}
        counts = {"operations": 10, "fusions": 5, "kernels": 3}
        return {"model": "m", "variant": variant, **parts, **spreads, **counts}

    saved = {
        "command": "python -m benchmarks.profiles first_step --models m",
        "date": "2026-12-05 00:00 UTC",
        "environment": "test",
        "provenance": "test",
        "rows": [row("keras", 8.0), row("keras_als", 12.0)],
    }
    table = first_step.render(saved)
    assert "| m | keras | " + " | ".join(["2.00 ± 0.01"] * 4) + " | 1.00 |" in table
    assert "| m | keras_als | " + " | ".join(["3.00 ± 0.01"] * 4) + " | 1.50 |" in table


def test_the_update_fusions_profile_counts_each_fusions_operands():
    from benchmarks.profiles import update_fusions

    program = "\n".join(
        [
            "  %a = f32[4]{0} fusion(%p0, %p1.2, %wrapped_reduce.3), kind=kLoop, calls=%c",
            "  %b = f32[]{0} fusion(%p0), kind=kInput, calls=%d",
            "  %c = f32[4]{0} add(%p0, %p1.2)",
        ]
    )
    assert update_fusions.fusion_operands(program) == [3, 1]


@pytest.mark.slow
def test_keras_copies_its_finiteness_predicate_into_every_update_and_keras_als_does_not():
    from benchmarks.profiles import update_fusions

    keras_found = {d: update_fusions.first_step(d, "keras") for d in (4, 12)}
    ours = {d: update_fusions.first_step(d, "keras_als") for d in (4, 12)}
    for depth in (4, 12):  # one fusion reads every variable's gradient finiteness
        assert keras_found[depth]["largest"] >= 2 * depth + 2
    # keras_als's largest fusion does not grow with the variables
    assert ours[4]["largest"] == ours[12]["largest"] < keras_found[12]["largest"]


def test_the_peak_buffers_profile_reads_the_buffers_live_at_xlas_peak(tmp_path):
    from benchmarks.harness import xla_memory
    from benchmarks.profiles import peak_buffers

    text = "\n".join(
        [
            "Total bytes used: 900 (0.00MiB)",
            "    conv.1{}:10-14",
            "    select_fusion{}:14-19",
            "  Live ranges at 14 (peak):",
            "    conv.1{}: 300 bytes (cumulative: 300 bytes)",
            "    arg0.1{}: 20 bytes (cumulative: 320 bytes)",
            "    select_fusion{}: 300 bytes (cumulative: 620 bytes)",
            "",
            "  Stack trace breakdown for peak usage: 620 bytes",
        ]
    )
    path = tmp_path / "step-buffer-assignment.txt"
    path.write_text(text)
    assert xla_memory.largest_buffer_assignment([str(path)], "step") == (900, text, str(path))
    assert xla_memory.peak_in(text) == 620
    assert peak_buffers.peak_buffers(text) == [
        ("conv.1", 300, "10-14"),
        ("select_fusion", 300, "14-19"),
        ("arg0.1", 20, "?"),
    ]
    program = "  %conv.1 = f32[5,5,8,8]{3,2,1,0} convolution(%a, %b), window={size=2x2}"
    assert peak_buffers.instruction(program, "conv.1") == "convolution f32[5,5,8,8]{3,2,1,0}"


def test_the_bridge_profile_lowers_every_chain_and_reports_each_beyond_the_empty_one():
    """Each chain lowers to XLA (a chain that does not fails the profile); the
    table gives the milliseconds per chain beyond the `none` chain."""
    from benchmarks.profiles import bridge_ops

    for chain in bridge_ops.CHAINS.values():
        assert bridge_ops.lowering_seconds(chain, 2) > 0
    table = bridge_ops.table({"none": 0.5, "reduce_max(abs(g))": 1.5}, chains=200)
    assert table.splitlines()[2:] == [
        "| `none` | 0.500 | 0.00 |",
        "| `reduce_max(abs(g))` | 1.500 | 5.00 |",
    ]
