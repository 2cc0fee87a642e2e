"""Builders of the tiny KerasHub models: task classes with `preprocessor=None`
(`classifier`, `causal_lm`, `seq2seq`, `image_classifier`), and the families
that need their own (a backbone and a float32 head, or sizes of their own).
Builders import keras_hub lazily."""

from __future__ import annotations

from collections.abc import Callable

import keras

from benchmarks.keras_hub_families.batches import CLASSES, IMAGE, SEQUENCE, VOCABULARY

SPARSE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
TEXT = {"vocabulary_size": VOCABULARY, "num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64}
"""The text backbones' common size."""
DECODER = TEXT | {"num_query_heads": 2, "num_key_value_heads": 1}
"""The grouped-query decoders' size."""


def hub():
    import keras_hub

    return keras_hub.models


def _head(backbone, output, classes: int) -> keras.Model:
    """`backbone`'s inputs to a float32 Dense of `classes` logits on `output`."""
    logits = keras.layers.Dense(classes, dtype="float32", name="logits")(output)
    return keras.Model(backbone.input, logits)


def _mean_pooled(backbone, key=None, classes: int = 2) -> keras.Model:
    out = backbone(backbone.input)
    out = out[key] if key else out
    return _head(backbone, keras.layers.GlobalAveragePooling1D(dtype="float32")(out), classes)


def classifier(task: str, backbone: str, **size) -> Callable[[], keras.Model]:
    """KerasHub text classifier `task` on `backbone(**TEXT, num_heads=2, dropout=0, **size)`."""

    def build():
        models = hub()
        options = TEXT | {"num_heads": 2, "dropout": 0.0, "max_sequence_length": SEQUENCE} | size
        options = {k: v for k, v in options.items() if v is not None}  # None: not taken
        trunk = getattr(models, backbone)(**options)
        return getattr(models, task)(trunk, num_classes=2, preprocessor=None, dropout=0.0)

    return build


def causal_lm(name: str, **size) -> Callable[[], keras.Model]:
    """KerasHub's `{name}CausalLM` on `{name}Backbone(**size)`."""

    def build():
        models = hub()
        trunk = getattr(models, f"{name}Backbone")(**size)
        return getattr(models, f"{name}CausalLM")(backbone=trunk, preprocessor=None)

    return build


def seq2seq(name: str, **size) -> Callable[[], keras.Model]:
    def build():
        models = hub()
        trunk = getattr(models, f"{name}Backbone")(**size)
        return getattr(models, f"{name}Seq2SeqLM")(backbone=trunk, preprocessor=None)

    return build


def image_classifier(name: str, head: dict | None = None, **size) -> Callable[[], keras.Model]:
    """KerasHub's `{name}ImageClassifier(**head)` (10 classes) on `{name}Backbone(**size)`."""

    def build():
        models = hub()
        trunk = getattr(models, f"{name}Backbone")(**size)
        return getattr(models, f"{name}ImageClassifier")(
            backbone=trunk, num_classes=CLASSES, preprocessor=None, **(head or {})
        )

    return build


def resnet_backbone(image_shape=(IMAGE, IMAGE, 3), stem: int = 16):
    """A tiny bottleneck ResNet (KerasHub's constructor wants 64 filters first)."""
    return hub().ResNetBackbone(
        input_conv_filters=[stem],
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64, 16, 16, 16],
        stackwise_num_blocks=[1, 1, 1, 1],
        stackwise_num_strides=[1, 2, 2, 2],
        block_type="bottleneck_block",
        image_shape=image_shape,
    )


def mit_backbone():
    return hub().MiTBackbone(
        layerwise_depths=[1, 1],
        num_layers=2,
        layerwise_num_heads=[1, 2],
        layerwise_sr_ratios=[2, 1],
        max_drop_path_rate=0.0,
        layerwise_patch_sizes=[3, 3],
        layerwise_strides=[2, 2],
        image_shape=(IMAGE, IMAGE, 3),
        hidden_dims=[16, 32],
    )


def electra():
    trunk = hub().ElectraBackbone(
        vocab_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        embedding_dim=32,
        intermediate_dim=64,
        dropout=0.0,
        max_sequence_length=SEQUENCE,
    )
    return _head(trunk, trunk(trunk.input)["pooled_output"], 2)


def xlnet():
    return _mean_pooled(hub().XLNetBackbone(**TEXT, num_heads=2))


def dinov2():
    trunk = hub().DINOV2Backbone(
        patch_size=8,
        num_layers=2,
        hidden_dim=32,
        num_heads=2,
        intermediate_dim=64,
        image_shape=(IMAGE, IMAGE, 3),
        position_embedding_shape=(IMAGE, IMAGE, 3),
    )
    return _head(trunk, keras.layers.Flatten()(trunk(trunk.input)[:, 0]), CLASSES)


def deeplab_v3():
    models = hub()
    trunk = models.DeepLabV3Backbone(
        image_encoder=resnet_backbone(),
        spatial_pyramid_pooling_key="P4",
        upsampling_size=4,
        dilation_rates=[1, 2],
        low_level_feature_key="P2",
        image_shape=(IMAGE, IMAGE, 3),
    )
    return models.DeepLabV3ImageSegmenter(
        backbone=trunk, num_classes=CLASSES + 1, preprocessor=None
    )


def segformer():
    models = hub()
    trunk = models.SegFormerBackbone(image_encoder=mit_backbone(), projection_filters=16)
    return models.SegFormerImageSegmenter(
        backbone=trunk, num_classes=CLASSES + 1, preprocessor=None
    )


def basnet():
    models = hub()
    trunk = models.BASNetBackbone(
        image_encoder=resnet_backbone((None, None, 3), stem=64),
        num_classes=1,
        image_shape=(IMAGE, IMAGE, 3),
    )
    return models.BASNetImageSegmenter(backbone=trunk, preprocessor=None)


def whisper():
    trunk = hub().WhisperBackbone(
        **TEXT,
        num_heads=2,
        num_mels=IMAGE,
        max_encoder_sequence_length=IMAGE,
        max_decoder_sequence_length=4,
    )
    out = trunk(trunk.input)["decoder_sequence_output"]
    return _head(trunk, out, VOCABULARY)


def moonshine():
    models = hub()
    trunk = models.MoonshineBackbone(
        vocabulary_size=VOCABULARY,
        filter_dim=32,
        encoder_num_layers=1,
        decoder_num_layers=1,
        hidden_dim=32,
        intermediate_dim=64,
        encoder_num_heads=2,
        decoder_num_heads=2,
        feedforward_expansion_factor=2,
    )
    return models.MoonshineAudioToText(backbone=trunk, preprocessor=None)
