"""The models of the study and their data: keras.applications and KerasHub, built offline.

`builder(name)` returns a model builder (`MODELS`, `OTHER_FAMILIES`, `TASKS`),
`data(name, batches)` its batches, and `build` a model and optimizer of either
method from the same weights. The test suite (`tests/test_real_models.py`),
`benchmarks.profiles.step_profile` and `benchmarks.profiles.wrap_sweep` build them from here."""

from __future__ import annotations

import functools

import keras
import numpy as np
import tensorflow as tf

import keras_als

BATCH = 8
SEQUENCE = 16
VOCABULARY = 128


def mobilenet_v2() -> keras.Model:
    """MobileNetV2 (width 0.35) on 32x32 images, 10 classes."""
    base = keras.applications.MobileNetV2(
        weights=None, input_shape=(32, 32, 3), include_top=False, alpha=0.35
    )
    return _image_head(base)


def resnet50_v2() -> keras.Model:
    """ResNet50V2 on 32x32 images, 10 classes."""
    return _application("ResNet50V2")


def _image_head(base: keras.Model) -> keras.Model:
    inputs = keras.Input((32, 32, 3), name="images")
    features = keras.layers.GlobalAveragePooling2D()(base(inputs))
    return keras.Model(inputs, keras.layers.Dense(10, dtype="float32", name="logits")(features))


TINY_BACKBONE = {
    "vocabulary_size": VOCABULARY,
    "num_layers": 2,
    "num_heads": 2,
    "hidden_dim": 32,
    "intermediate_dim": 64,
    "max_sequence_length": SEQUENCE,
}
"""The KerasHub backbones' size: two blocks, built from the constructor (no download)."""


def gpt2_tiny() -> keras.Model:
    """A two-block KerasHub GPT-2 backbone, mean-pooled, 2 classes."""
    import keras_hub

    return mean_pooled(keras_hub.models.GPT2Backbone(**TINY_BACKBONE))


def bert_tiny() -> keras.Model:
    """A two-block KerasHub BERT backbone, its pooled output, 2 classes."""
    import keras_hub

    backbone = keras_hub.models.BertBackbone(**TINY_BACKBONE)
    return _text_head(backbone, backbone(backbone.input)["pooled_output"])


def _text_head(backbone: keras.Model, pooled) -> keras.Model:
    logits = keras.layers.Dense(2, dtype="float32", name="logits")(pooled)
    return keras.Model(backbone.input, logits)


MODELS = {
    "mobilenet_v2": mobilenet_v2,
    "resnet50_v2": resnet50_v2,
    "gpt2_tiny": gpt2_tiny,
    "bert_tiny": bert_tiny,
}


def _application(name: str) -> keras.Model:
    """keras.applications model `name` (`weights=None`, 32x32) under the image head."""
    base = getattr(keras.applications, name)(
        weights=None, include_top=False, input_shape=(32, 32, 3)
    )
    return _image_head(base)


def _text_backbone(name: str) -> keras.Model:
    """KerasHub backbone `name`, of `TINY_BACKBONE`'s size, mean-pooled."""
    import keras_hub

    size = dict(TINY_BACKBONE)
    if name == "GemmaBackbone":  # no position table; grouped-query attention
        del size["num_heads"], size["max_sequence_length"]
        size.update(num_query_heads=2, num_key_value_heads=1, head_dim=16)
    return mean_pooled(getattr(keras_hub.models, name)(**size))


def mean_pooled(backbone: keras.Model) -> keras.Model:
    """A KerasHub text backbone, its sequence output mean-pooled, 2 classes."""
    sequence = backbone(backbone.input)
    if isinstance(sequence, dict):
        sequence = sequence["sequence_output"]
    return _text_head(backbone, keras.layers.GlobalAveragePooling1D()(sequence))


_OTHER_APPLICATIONS = {
    "efficientnet_b0": "EfficientNetB0",
    "densenet121": "DenseNet121",
    "convnext_tiny": "ConvNeXtTiny",
    "mobilenet_v3_small": "MobileNetV3Small",
}
_OTHER_BACKBONES = {
    "distilbert_tiny": "DistilBertBackbone",
    "roberta_tiny": "RobertaBackbone",
    "opt_tiny": "OPTBackbone",
    "gemma_tiny": "GemmaBackbone",
}
OTHER_FAMILIES = {
    **{name: functools.partial(_application, c) for name, c in _OTHER_APPLICATIONS.items()},
    **{name: functools.partial(_text_backbone, c) for name, c in _OTHER_BACKBONES.items()},
}
"""More models of the same families (32x32 images under the same head; tiny
text backbones, mean-pooled): the fixes must hold beyond the four above.
`--models` takes them too; the table shows their skipped steps apart."""

_IMAGE_MODELS = {"mobilenet_v2", "resnet50_v2", *_OTHER_APPLICATIONS}


def retinanet() -> keras.Model:
    """The RetinaNet detector of issue 40's detection section (`keras_hub_tasks.retinanet`)."""
    from benchmarks.keras_hub_tasks import retinanet as study

    return study.detector()


def gemma_lora() -> keras.Model:
    """The Gemma causal LM of issue 40's LoRA section, LoRA enabled (`keras_hub_tasks.lora`)."""
    from benchmarks.harness import hub_tasks
    from benchmarks.keras_hub_tasks import lora

    return lora.with_lora(hub_tasks.gemma_causal_lm())


TASKS = {"retinanet": retinanet, "gemma_lora": gemma_lora}
"""The KerasHub tasks of issue 40's sections, as those sections train them
(their own losses, their data, their batch: `batch_size`), for the cost parts: the
sections time whole blocks of `fit`, which cannot split a cost by variant.
Their skipped steps are the sections' own (`--parts skips` refuses them)."""


def builder(name: str):
    """The function that builds model `name` (of `MODELS`, `OTHER_FAMILIES` or `TASKS`)."""
    for models in (MODELS, OTHER_FAMILIES, TASKS):
        if name in models:
            return models[name]
    known = ", ".join([*MODELS, *OTHER_FAMILIES, *TASKS])
    raise ValueError(f"Unknown model {name!r}: choose from {known}.")


def batch_size(name: str) -> int:
    """Examples a step for model `name`: a task's section's `BATCH`, else `BATCH`."""
    if name not in TASKS:
        return BATCH
    from benchmarks.keras_hub_tasks import lora, retinanet

    return {"retinanet": retinanet.BATCH, "gemma_lora": lora.BATCH}[name]


def data(name: str, batches: int, seed: int = 0):
    """`batches` batches of inputs and labels for model `name`: random ones
    for `MODELS` and `OTHER_FAMILIES` and byte windows of the standard
    library's docstrings for the language model, drawn by `seed`; the first
    training canvases of the pasted digits, with their boxes, for RetinaNet."""
    n = batches * batch_size(name)
    if name in TASKS:
        from benchmarks.harness import hub_tasks

        if name == "retinanet":
            return hub_tasks.detection_data("train", n)
        return hub_tasks.text_batches(n, seed=seed)
    rng = np.random.default_rng(seed)
    if name in _IMAGE_MODELS:
        return rng.normal(size=(n, 32, 32, 3)).astype("float32"), rng.integers(0, 10, n)
    x = {
        "token_ids": rng.integers(1, VOCABULARY, size=(n, SEQUENCE)).astype("int32"),
        "padding_mask": np.ones((n, SEQUENCE), "int32"),
    }
    if name == "bert_tiny":
        x["segment_ids"] = np.zeros((n, SEQUENCE), "int32")
    return x, rng.integers(0, 2, n)


def train_on_batch(model: keras.Model, x, y):
    """One training step of `model` on `x`, `y`: Keras's `Model.train_on_batch`.

    Called on Keras's class, since KerasHub 0.32's tasks override it with one
    that converts `y` to a single tensor, which fails on RetinaNet's dict of
    boxes and labels (`model.fit` takes it); without a preprocessor (as every
    task here is built) that override does nothing else.
    """
    return keras.Model.train_on_batch(model, x, y)


def batch(x, i: int):
    """Batch `i` of inputs `x` (an array or a dict of arrays)."""
    return keras.tree.map_structure(lambda a: a[i * BATCH : (i + 1) * BATCH], x)


class _KerasWithState(keras.optimizers.LossScaleOptimizer):
    """Keras's LossScaleOptimizer that also assigns `count` small variables every
    step, as many as keras_als's optimizer adds to Keras's: what that state alone
    costs the compiled step (ablation only)."""

    def __init__(self, inner_optimizer, count: int, **kwargs):
        super().__init__(inner_optimizer, **kwargs)
        self.count = count
        self.state = []

    def build(self, var_list):
        super().build(var_list)
        self.state = [
            self.add_variable(shape=(8,), initializer="zeros", name=f"state_{i}")
            for i in range(self.count)
        ]

    def apply(self, grads, trainable_variables=None):
        if not self.built:
            with tf.init_scope():
                self.build(trainable_variables)
        for variable in self.state:
            variable.assign(variable + 1.0)
        return super().apply(grads, trainable_variables)


def build(
    name: str,
    method: str,
    seed: int = 0,
    policy: str = "mixed_float16",
    jit: bool = True,
    wrap: bool | None = None,
    state_variables: int = 0,
    scale_policy="max_safe",
):
    """Model `name` for `method` ("keras" or "keras_als") and its optimizer, compiled
    (with XLA unless `jit` is False); the model is wrapped for keras_als unless
    `wrap` says otherwise, and Keras's optimizer assigns `state_variables` small
    variables of its own every step, and keras_als's takes `scale_policy` (the
    breakdown's ablations). RetinaNet compiles with its own losses, the
    others with sparse categorical cross-entropy."""
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(seed)
    model = builder(name)()
    if wrap is None:
        wrap = method == "keras_als"
    if wrap:
        model = keras_als.wrap_model(model)
    if method == "keras_als":
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.Adam(1e-3), policy=scale_policy
        )
    elif state_variables:
        optimizer = _KerasWithState(keras.optimizers.Adam(1e-3), state_variables)
    else:
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    own_loss = {} if name == "retinanet" else {"loss": loss}  # the detector's own losses
    model.compile(optimizer=optimizer, jit_compile=jit, **own_loss)
    return model, optimizer
