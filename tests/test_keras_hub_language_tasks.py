"""KerasHub language tasks instrumented in place: tied embeddings, `.keras`
files and more families.

Tiny tasks on the real models' backbones (`tests/tasks.py`'s
`LANGUAGE_TASKS`, built from their constructors without dropout; no
download). Every comparison with "the plain task" is with a separate task
built the same way with the same weights.
"""

import json

import keras
import numpy as np
import pytest

import keras_als
from benchmarks.profiles import wrap_sweep
from benchmarks.real_models import architectures
from keras_als import policies
from tests import in_place, models, tasks

pytest.importorskip("keras_hub")


TIED = {  # the embedding a task calls again, or a head holds, by the end of its path
    "gpt2_causal_lm": "token_embedding/embeddings",
    "opt_causal_lm": "token_embedding/embeddings",
    "bert_masked_lm": "token_embedding/embeddings",
    "bert_text_classifier": None,
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(tasks.LANGUAGE_TASKS))
def test_a_keras_hub_task_keeps_its_tied_embedding_one_variable_and_trains_as_the_plain_one(
    name,
):
    """KerasHub tasks call a backbone's layer again: GPT-2's and OPT's causal
    LMs call the token embedding (OPT's sits inside its embeddings layer),
    reversed, on the backbone's output, and BERT's masked LM head holds the
    backbone's token embedding. Instrumented in place, the task keeps every
    weight object, so the tied embedding stays one variable, and it trains.
    Outputs equal the plain task's; float32, SGD, 3 steps: scales that
    differ from layer to layer and scale 1 give bit-identical weights, and
    both stay within 1e-5 of the plain task's (relative to its largest
    weight)."""
    model, plain = tasks.language_task(name), tasks.language_task(name)
    plain.set_weights(model.get_weights())
    in_place.wrap_in_place(model)
    tied = [v for v in model.trainable_variables if TIED[name] and v.path.endswith(TIED[name])]
    assert len(tied) == (1 if TIED[name] else 0), [v.path for v in tied]
    x, y = tasks.language_task_batches(name, 3)
    in_place.assert_same_outputs(model, plain, architectures.batch(x, 0))

    def train(model, policy=None):
        optimizer = keras.optimizers.SGD(0.1)
        if policy is not None:
            optimizer = keras_als.AdaptiveLossScaleOptimizer(
                optimizer, policy=policy, measure_every_n_steps=1
            )
        in_place.train(model, optimizer, x, y, steps=3, jit_compile=False)
        return optimizer, [np.asarray(w) for w in model.weights]

    before = [np.asarray(v) for v in tied]
    expected = train(plain)[1]
    optimizer, chosen = train(model, models.per_layer_fixed(model, default=1.0))
    assert len(set(optimizer.layer_scales().values())) > 1, optimizer.layer_scales()
    for v, value in zip(tied, before):  # the one variable trained
        assert np.any(np.asarray(v) != value), v.path
    one = train(keras_als.wrap_model(tasks.language_task(name)), policies.Fixed(default=1.0))[1]
    for a, b in zip(chosen, one, strict=True):
        np.testing.assert_array_equal(a, b)
    largest = max(np.max(np.abs(w)) for w in expected)
    error = max(np.max(np.abs(a - b)) for a, b in zip(chosen, expected, strict=True))
    assert error <= 1e-5 * largest, error


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_masked_lm", "gpt2_causal_lm", "opt_causal_lm"])
def test_an_instrumented_keras_hub_language_model_saves_a_keras_file_of_the_task(name, tmp_path):
    """The `.keras` file of an instrumented task is the task's own: it loads
    as the task's class, with no keras_als in its config, the same weight
    paths, and the plain task's outputs bit for bit; instrumented again, its
    tied embedding is still one variable."""
    model, plain = tasks.language_task(name), tasks.language_task(name)
    plain.set_weights(model.get_weights())
    keras_als.wrap_model(model)
    x, _ = tasks.language_task_batches(name, 1)
    model.save(tmp_path / "task.keras")
    reloaded = keras.saving.load_model(tmp_path / "task.keras")
    assert type(reloaded) is type(model)
    assert "keras_als" not in json.dumps(reloaded.get_config(), default=str)
    assert [w.path for w in reloaded.weights] == [w.path for w in model.weights]
    np.testing.assert_array_equal(in_place.outputs(reloaded, x), in_place.outputs(plain, x))
    in_place.wrap_in_place(reloaded)
    tied = [v for v in reloaded.trainable_variables if v.path.endswith(TIED[name])]
    assert len(tied) == 1, [v.path for v in tied]


MORE_TASKS = [
    "DebertaV3MaskedLM",  # a layer that makes weights in call
    "FalconCausalLM",
    "GemmaCausalLM",
    "Qwen3_5CausalLM",  # a decoder that cannot be traced on symbolic shapes
    "RobertaMaskedLM",
    "XLMRobertaTextClassifier",
]


@pytest.mark.slow
@pytest.mark.parametrize("name", MORE_TASKS)
def test_more_keras_hub_tasks_keep_every_weight_and_compute_the_same_outputs(name):
    """Tasks of more families, on tiny backbones (`wrap_sweep.tiny_backbone`),
    instrumented in place: every weight object, path and order, the class and
    config kept; traced outputs equal a plain task's with the same weights
    within float32 rounding; every layer with weights gets a scale."""
    import keras_hub

    task_class = getattr(keras_hub.models, name)
    extra = {"num_classes": 2} if name.endswith("Classifier") else {}

    def task():
        backbone = wrap_sweep.tiny_backbone(task_class.backbone_cls.__name__)
        return task_class(backbone=backbone, preprocessor=None, **extra)

    model, plain = in_place.twice(task)
    in_place.wrap_in_place(model)
    rng = np.random.default_rng(0)
    x = {}
    for key, tensor in model.input.items():
        shape = (2, *(architectures.SEQUENCE if d is None else d for d in tensor.shape[1:]))
        if "mask" in key and key != "mask_positions":
            x[key] = np.ones(shape, "int32")
        elif key == "segment_ids":
            x[key] = np.zeros(shape, "int32")
        else:
            x[key] = rng.integers(1, 4, shape).astype("int32")
    in_place.assert_same_outputs(model, plain, x)
