"""Models as their users hold them, built tiny from their constructors (no
download): KerasHub tasks (`TASKS`) and keras.applications classifiers with
their own top (`APPLICATIONS`), each with the data it trains on and its loss;
KerasHub language tasks on the real models' tiny backbones, without
dropout (`LANGUAGE_TASKS`), with their token batches; and the flat-regions
study's Swin against Keras's `LossScaleOptimizer` (`swin_on_flat_canvases`).
"""

import keras
import numpy as np

from benchmarks.harness import hub_tasks
from benchmarks.real_models import architectures

SPARSE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
TASKS = {  # builder, data, loss (None: the task's own)
    "retinanet": (hub_tasks.retinanet, lambda: hub_tasks.detection_data("train", 32), None),
    "gpt2_causal_lm": (hub_tasks.gpt2_causal_lm, lambda: hub_tasks.text_batches(32), SPARSE),
    "gemma_causal_lm": (hub_tasks.gemma_causal_lm, lambda: hub_tasks.text_batches(32), SPARSE),
    "deeplab_v3": (hub_tasks.deeplab_v3, lambda: hub_tasks.segmentation_data(16), SPARSE),
    "vit_classifier": (hub_tasks.vit_classifier, lambda: hub_tasks.classification_data(32), SPARSE),
}


def _application(name: str, **options):
    """keras.applications model `name` with its top: 10 classes (logits) on the
    48x48 canvases of `hub_tasks.classification_data`."""

    def build():
        return getattr(keras.applications, name)(
            weights=None,
            input_shape=(hub_tasks.IMAGE, hub_tasks.IMAGE, 3),
            classes=10,
            classifier_activation=None,
            **options,
        )

    return build


APPLICATIONS = {
    "mobilenet_v2": (
        _application("MobileNetV2", alpha=0.35),
        lambda: hub_tasks.classification_data(32),
        SPARSE,
    ),
    "densenet121": (_application("DenseNet121"), lambda: hub_tasks.classification_data(32), SPARSE),
}
MODELS = TASKS | APPLICATIONS


def build(name: str, policy: str = "float32", seed: int = 0) -> keras.Model:
    """Model `name` of `MODELS`, built under the global dtype policy `policy`
    (left set) and random seed `seed`."""
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(seed)
    return MODELS[name][0]()


def data(name: str):
    """`(x, y)`: the data model `name` trains on."""
    return MODELS[name][1]()


def compile_with(model: keras.Model, name: str, optimizer, jit_compile: bool = False) -> None:
    """Compiles `model` (model `name`) with `optimizer` and its loss (a task's own where None)."""
    loss = MODELS[name][2]
    model.compile(
        optimizer=optimizer,
        jit_compile=jit_compile,
        **({"loss": loss} if loss is not None else {}),
    )


def swin_on_flat_canvases(steps: int, seed: int):
    """KerasHub's Swin of the flat-regions study on `steps` batches of 8
    canvases of exact zeros, under mixed_float16 (left set): Keras's
    `LossScaleOptimizer` trains one (Adam 1e-3, XLA) with `fit`, and a second,
    with the same initial weights, is wrapped and compiled with keras_als's.

    Returns:
        `(x, y, model, optimizer, keras_skipped)`: the batches, the keras_als
        model and optimizer (not trained yet), and Keras's skipped steps.
    """
    import keras_als
    from benchmarks.flat_regions import models

    x, y = models.classification("train")
    x, y = x[: 8 * steps], y[: 8 * steps]
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(seed)
    plain = models.swin_classifier()
    weights = plain.get_weights()
    keras_optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    plain.compile(optimizer=keras_optimizer, jit_compile=True)
    plain.fit(x, y, batch_size=8, verbose=0, shuffle=False)
    keras_skipped = steps - int(keras_optimizer.iterations.numpy())

    model = keras_als.wrap_model(models.swin_classifier())
    model.set_weights(weights)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(optimizer=optimizer, jit_compile=True)
    return x, y, model, optimizer, keras_skipped


LANGUAGE_TASKS = {  # task class, backbone class
    "gpt2_causal_lm": ("GPT2CausalLM", "GPT2Backbone"),
    "opt_causal_lm": ("OPTCausalLM", "OPTBackbone"),
    "bert_masked_lm": ("BertMaskedLM", "BertBackbone"),
    "bert_text_classifier": ("BertTextClassifier", "BertBackbone"),
}


def language_task(name):
    """A tiny KerasHub task, without dropout (runs compared step by step
    would draw different masks)."""
    import keras_hub

    task, backbone = (getattr(keras_hub.models, n) for n in LANGUAGE_TASKS[name])
    keras.utils.set_random_seed(0)
    backbone = backbone(**architectures.TINY_BACKBONE, dropout=0.0)
    if name == "bert_text_classifier":
        return task(backbone, num_classes=2, preprocessor=None, dropout=0.0)
    return task(backbone=backbone, preprocessor=None)


def language_task_batches(name, batches):
    """Inputs and labels for `batches` batches of task `name`."""
    rng = np.random.default_rng(0)
    n, length = batches * architectures.BATCH, architectures.SEQUENCE
    tokens = rng.integers(1, architectures.VOCABULARY, (n, length)).astype("int32")
    x = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}
    if name.startswith("bert"):
        x["segment_ids"] = np.zeros_like(tokens)
    if name == "bert_text_classifier":
        return x, rng.integers(0, 2, n)
    if name == "bert_masked_lm":
        x["mask_positions"] = np.tile(np.array([[1, 5]], "int32"), (n, 1))
        return x, tokens[:, [1, 5]]
    return x, np.roll(tokens, -1, axis=1)  # the next token
