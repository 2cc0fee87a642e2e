"""The cost-at-size study: its plan, ratios and tables on synthetic numbers, and one real run."""

import math
import statistics

import pytest

from benchmarks.cost_at_size import measure, plan, report


def _row(model="m", step=(0.10, 0.12, 0.11, 0.13), first=(10.0, 11.0, 12.0, 13.0), extra=None):
    """A result row: keras's two instances first, then keras_als's."""
    row = {
        "model": model,
        "scales": 5,
        "variables": 9,
        "provenance": "commit x",
        "step": {"keras": list(step[:2]), "keras_als": list(step[2:])},
        "first_step": {"keras": list(first[:2]), "keras_als": list(first[2:])},
        "peak_bytes": {"keras": [100, 100], "keras_als": [101, 101]},
    }
    for measure_name, values in (extra or {}).items():
        row[measure_name]["keras_als:no_crossing_reductions"] = values
    return row


def test_a_ratio_is_the_geometric_mean_over_keras_with_the_instances_standard_error():
    found = report.ratios(_row())
    ours, theirs = [0.11, 0.13], [0.10, 0.12]
    expected = math.sqrt(ours[0] * ours[1]) / math.sqrt(theirs[0] * theirs[1])
    ratio, error = found["step"]
    assert ratio == pytest.approx(expected, rel=1e-12)
    spread = [statistics.variance([math.log(v) for v in vs]) / 2 for vs in (ours, theirs)]
    assert error == pytest.approx(expected * math.sqrt(sum(spread)), rel=1e-12)
    assert found["peak_bytes"] == (pytest.approx(1.01), 0.0)


def test_the_table_marks_a_ratio_over_its_target_and_lists_the_models_not_measured():
    fast = _row("resnet50", step=(0.10, 0.10, 0.101, 0.101), first=(10, 10, 10.5, 10.5))
    slow = _row("densenet121", step=(0.10, 0.10, 0.12, 0.12), first=(10, 10, 12, 12))
    text = report.render({"command": "c", "date": "d", "environment": "e", "rows": [fast, slow]})
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines() if "|" in line}
    assert "**1.200" in lines["densenet121"] and "**1.200 ± 0.000**" in lines["densenet121"]
    assert "1.010 ± 0.000" in lines["resnet50"] and "**1.010" not in lines["resnet50"]
    assert "1.050" in lines["resnet50"]  # first step within 1.10: not bold
    missing = text.split("Not measured yet: ")[1].split(".")[0].split(", ")
    assert "densenet121" not in missing and "vit_base" in missing and "densenet_8x4" in missing


def test_each_row_says_the_cpu_it_was_measured_on_or_that_it_was_not_recorded():
    recorded = _row("resnet50") | {"cpu": "AMD EPYC, no avx512_fp16"}
    text = report.render(
        {"command": "c", "date": "d", "environment": "e", "rows": [recorded, _row("vit_base")]}
    )
    per_row = text.split("Code and CPU measured per row: ")[1]
    assert "resnet50 commit x, on AMD EPYC, no avx512_fp16;" in per_row
    assert "vit_base commit x, CPU not recorded." in per_row


def test_the_cpu_is_its_model_name_and_whether_it_has_avx512_fp16(tmp_path):
    from benchmarks.harness import provenance

    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Some CPU 9\nflags\t\t: fpu avx512f avx512_fp16 sse\n" * 2)
    assert provenance.cpu(str(info)) == "Some CPU 9, with avx512_fp16"
    info.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx512f avx512_bf16\n")
    assert provenance.cpu(str(info)) == "AMD EPYC, no avx512_fp16"
    assert provenance.cpu(str(tmp_path / "missing"))  # falls back to Python's own name


def test_an_ablation_gets_a_table_of_its_own():
    row = _row(
        extra={
            "step": [0.105, 0.115],
            "first_step": [10.0, 11.0],
            "peak_bytes": [100, 100],
        }
    )
    text = report.render({"command": "c", "date": "d", "environment": "e", "rows": [row]})
    ablation = [line for line in text.splitlines() if "| no_crossing_reductions |" in line]
    expected = math.sqrt(0.105 * 0.115) / math.sqrt(0.10 * 0.12)
    assert len(ablation) == 1 and f"{expected:.3f}" in ablation[0]


def test_every_method_compiles_first_as_often_as_last():
    order = measure.build_order(("keras", "keras_als"))
    assert order == ("keras", "keras_als", "keras_als", "keras")
    assert measure.build_order(("a", "b", "c")) == ("a", "b", "c", "c", "b", "a")


def test_an_unknown_model_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="densenet121.*densenet_1x4"):
        plan.builder("densenet12")


def test_text_models_get_token_batches_and_images_models_image_batches():
    x, y = plan.data("bert_base")
    assert x["token_ids"].shape == (plan.BATCH, plan.SEQUENCE) and y.shape == (plan.BATCH,)
    x, y = plan.data("gpt2_base")
    assert (y[:, :-1] == x["token_ids"][:, 1:]).all()  # the next token
    x, y = plan.data("densenet121")
    assert x.shape == (plan.BATCH, plan.IMAGE, plan.IMAGE, 3) and y.max() < plan.CLASSES


def _small_dense_block():
    """A DenseNet-like block of Keras layers (BatchNormalization, Conv2D, Concatenate),
    small enough to compile in seconds: the measurement, not the model, is tested."""
    import keras

    inputs = keras.Input((plan.IMAGE, plan.IMAGE, 3))
    x = keras.layers.Conv2D(8, 3, strides=4)(inputs)
    for _ in range(2):
        y = keras.layers.BatchNormalization()(x)
        y = keras.layers.Conv2D(4, 3, padding="same", activation="relu")(y)
        x = keras.layers.Concatenate()([x, y])
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(plan.CLASSES, activation="softmax")(x))


@pytest.mark.slow
def test_a_real_model_is_measured_for_both_methods_and_an_ablation(monkeypatch):
    monkeypatch.setattr(plan, "WARMUP", 2)
    monkeypatch.setattr(plan, "ROUNDS", 3)
    monkeypatch.setattr(plan, "builder", lambda name: _small_dense_block)
    result = measure.measure("densenet_1x4", dump=None, ablation="no_crossing_reductions")
    methods = {"keras", "keras_als", "keras_als:no_crossing_reductions"}
    for name in ("step", "first_step"):
        assert set(result[name]) == methods
        assert all(len(v) == 2 and min(v) > 0 for v in result[name].values())
    weighted = sum(1 for layer in _small_dense_block().layers if layer.trainable_weights)
    assert result["scales"] == weighted
    assert set(report.ratios(result)) == {"step", "first_step"}  # no dump: no peak


def test_the_peak_is_read_from_the_largest_step_program_dumped_since_the_last_reading(tmp_path):
    def dump(name, total, peak):
        text = f"Total bytes used: {total}\nBufferAssignment stats:\n  peak usage: {peak} bytes\n"
        (tmp_path / f"module_{name}.one_step_on_data.buffer-assignment.txt").write_text(text)

    seen: set[str] = set()
    dump("warm_up", 10, 7)
    assert measure.peak_of_new_programs(str(tmp_path), seen) == 7
    dump("first_trace", 100, 60)
    dump("second_trace", 300, 200)
    assert measure.peak_of_new_programs(str(tmp_path), seen) == 200  # the larger total's
    assert measure.peak_of_new_programs(str(tmp_path), seen) is None  # nothing new
