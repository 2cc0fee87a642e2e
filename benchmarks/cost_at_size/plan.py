"""The cost study's plan: its models, settings and repetitions (fixed before the numbers)."""

from __future__ import annotations

import functools

import keras

IMAGE = 64
"""Side of the images, in pixels."""
SEQUENCE = 64
"""Tokens per text example."""
BATCH = 4
CLASSES = 10
INSTANCES = 2
"""Compiled instances of each method per model."""
WARMUP = 48
"""Steps each instance runs before timing: past the measuring period's ramp."""
ROUNDS = 30
"""Timed rounds, one step of every instance each."""
LEARNING_RATE = 0.01
DEPTHS = (1, 2, 4, 8)
"""Layers per dense block of the depth sweep's DenseNets (DenseNet121 has 6, 12, 24, 16)."""
TARGETS = {"step": 1.02, "first_step": 1.10, "peak_memory": 1.02}
"""keras_als over Keras LSO, at most (issue 79)."""


def _application(name: str) -> keras.Model:
    return getattr(keras.applications, name)(
        weights=None, input_shape=(IMAGE, IMAGE, 3), classes=CLASSES
    )


def densenet(layers_per_block: int) -> keras.Model:
    """A DenseNet of four dense blocks of `layers_per_block` layers (the depth sweep)."""
    from keras.src.applications.densenet import DenseNet

    return DenseNet(
        [layers_per_block] * 4, weights=None, input_shape=(IMAGE, IMAGE, 3), classes=CLASSES
    )


def bert_base() -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=30522,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
        max_sequence_length=512,
    )
    return keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None)


def vit_base() -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(IMAGE, IMAGE, 3),
        patch_size=16,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        mlp_dim=3072,
    )
    return keras_hub.models.ViTImageClassifier(backbone, num_classes=CLASSES, preprocessor=None)


def gpt2_base() -> keras.Model:
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=50257,
        num_layers=12,
        num_heads=12,
        hidden_dim=768,
        intermediate_dim=3072,
        max_sequence_length=1024,
    )
    return keras_hub.models.GPT2CausalLM(backbone, preprocessor=None)


def llama_reduced() -> keras.Model:
    """A Llama-shaped decoder (grouped-query attention, SwiGLU, RMS norm) at width 512, 8 layers."""
    import keras_hub

    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=32000,
        num_layers=8,
        num_query_heads=8,
        num_key_value_heads=4,
        hidden_dim=512,
        intermediate_dim=1376,
    )
    return keras_hub.models.LlamaCausalLM(backbone, preprocessor=None)


def swin_tiny() -> keras.Model:
    """Swin-T's widths and depths (96; 2, 2, 6, 2; heads 3, 6, 12, 24), patch 2, window 4."""
    import keras_hub

    backbone = keras_hub.models.SwinTransformerBackbone(
        image_shape=(IMAGE, IMAGE, 3),
        embed_dim=96,
        depths=[2, 2, 6, 2],
        num_heads=[3, 6, 12, 24],
        window_size=4,
        patch_size=2,
    )
    return keras_hub.models.SwinTransformerImageClassifier(
        backbone=backbone, num_classes=CLASSES, preprocessor=None
    )


_APPLICATIONS = {
    "densenet121": "DenseNet121",
    "densenet169": "DenseNet169",
    "densenet201": "DenseNet201",
    "resnet50": "ResNet50",
    "resnet101": "ResNet101",
    "resnet152": "ResNet152",
    "efficientnet_b0": "EfficientNetB0",
    "efficientnet_b1": "EfficientNetB1",
    "efficientnet_b2": "EfficientNetB2",
    "efficientnet_b3": "EfficientNetB3",
    "convnext_tiny": "ConvNeXtTiny",
    "mobilenet_v3_small": "MobileNetV3Small",
    "mobilenet_v3_large": "MobileNetV3Large",
}
_HUB = {
    "bert_base": bert_base,
    "vit_base": vit_base,
    "gpt2_base": gpt2_base,
    "swin_tiny": swin_tiny,
    "llama_reduced": llama_reduced,
}
MODELS = {
    **{name: functools.partial(_application, cls) for name, cls in _APPLICATIONS.items()},
    **_HUB,
}
"""Every model of the study, by name: a function that builds it."""
SWEEP = {f"densenet_{n}x4": functools.partial(densenet, n) for n in DEPTHS}
"""The depth sweep's models."""
TEXT = {"bert_base", "gpt2_base", "llama_reduced"}
LANGUAGE_MODELS = {"gpt2_base", "llama_reduced"}


def builder(name: str):
    """The function that builds model `name` (of `MODELS` or `SWEEP`)."""
    if name in MODELS:
        return MODELS[name]
    if name in SWEEP:
        return SWEEP[name]
    raise ValueError(f"Unknown model {name!r}: choose from {', '.join([*MODELS, *SWEEP])}.")


def data(name: str, seed: int = 0):
    """One batch of inputs and labels for model `name` (random, drawn by `seed`)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if name not in TEXT:
        images = rng.normal(size=(BATCH, IMAGE, IMAGE, 3)).astype("float32")
        return images, rng.integers(0, CLASSES, BATCH)
    vocabulary = 1000
    tokens = rng.integers(1, vocabulary, size=(BATCH, SEQUENCE)).astype("int32")
    x = {"token_ids": tokens, "padding_mask": np.ones((BATCH, SEQUENCE), "int32")}
    if name == "bert_base":
        x["segment_ids"] = np.zeros((BATCH, SEQUENCE), "int32")
        return x, rng.integers(0, 2, BATCH)
    return x, np.roll(tokens, -1, axis=1)  # the next token
