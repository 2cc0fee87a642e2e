"""The families: tiny KerasHub models from their constructors, and the data each trains on.

`FAMILIES[name]` is a `Family`: its kind (which data it takes) and a builder
that returns a compiled-ready model. Builders import keras_hub lazily; the
data (`data(kind, split)`) comes from the standard library's docstrings and
scikit-learn's digits (see the plan in the package docstring).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import zlib
from collections.abc import Callable

import keras
import numpy as np

from benchmarks.harness import hub_tasks

VOCABULARY = 1000
SEQUENCE = 16
IMAGE = 32
CLASSES = 10
TRAIN, HELD_OUT = 160, 32
SPARSE = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
TEXT = {"vocabulary_size": VOCABULARY, "num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64}
"""The text backbones' common size."""
DECODER = TEXT | {"num_query_heads": 2, "num_key_value_heads": 1}
"""The grouped-query decoders' size."""


@dataclasses.dataclass(frozen=True)
class Family:
    """One family: `kind` names its data (`data`), `build` returns the model;
    `loss` is passed to `compile` (None: the task's own)."""

    kind: str
    build: Callable[[], keras.Model]
    loss: object = None


def _hub():
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
        models = _hub()
        options = TEXT | {"num_heads": 2, "dropout": 0.0, "max_sequence_length": SEQUENCE} | size
        options = {k: v for k, v in options.items() if v is not None}  # None: not taken
        trunk = getattr(models, backbone)(**options)
        return getattr(models, task)(trunk, num_classes=2, preprocessor=None, dropout=0.0)

    return build


def causal_lm(name: str, **size) -> Callable[[], keras.Model]:
    """KerasHub's `{name}CausalLM` on `{name}Backbone(**size)`."""

    def build():
        models = _hub()
        trunk = getattr(models, f"{name}Backbone")(**size)
        return getattr(models, f"{name}CausalLM")(backbone=trunk, preprocessor=None)

    return build


def seq2seq(name: str, **size) -> Callable[[], keras.Model]:
    def build():
        models = _hub()
        trunk = getattr(models, f"{name}Backbone")(**size)
        return getattr(models, f"{name}Seq2SeqLM")(backbone=trunk, preprocessor=None)

    return build


def image_classifier(name: str, head: dict | None = None, **size) -> Callable[[], keras.Model]:
    """KerasHub's `{name}ImageClassifier(**head)` (10 classes) on `{name}Backbone(**size)`."""

    def build():
        models = _hub()
        trunk = getattr(models, f"{name}Backbone")(**size)
        return getattr(models, f"{name}ImageClassifier")(
            backbone=trunk, num_classes=CLASSES, preprocessor=None, **(head or {})
        )

    return build


def _resnet(image_shape=(IMAGE, IMAGE, 3), stem: int = 16):
    """A tiny bottleneck ResNet (KerasHub's constructor wants 64 filters first)."""
    return _hub().ResNetBackbone(
        input_conv_filters=[stem],
        input_conv_kernel_sizes=[3],
        stackwise_num_filters=[64, 16, 16, 16],
        stackwise_num_blocks=[1, 1, 1, 1],
        stackwise_num_strides=[1, 2, 2, 2],
        block_type="bottleneck_block",
        image_shape=image_shape,
    )


def _mit():
    return _hub().MiTBackbone(
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
    trunk = _hub().ElectraBackbone(
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
    return _mean_pooled(_hub().XLNetBackbone(**TEXT, num_heads=2))


def dinov2():
    trunk = _hub().DINOV2Backbone(
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
    models = _hub()
    trunk = models.DeepLabV3Backbone(
        image_encoder=_resnet(),
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
    models = _hub()
    trunk = models.SegFormerBackbone(image_encoder=_mit(), projection_filters=16)
    return models.SegFormerImageSegmenter(
        backbone=trunk, num_classes=CLASSES + 1, preprocessor=None
    )


def basnet():
    models = _hub()
    trunk = models.BASNetBackbone(
        image_encoder=_resnet((None, None, 3), stem=64),
        num_classes=1,
        image_shape=(IMAGE, IMAGE, 3),
    )
    return models.BASNetImageSegmenter(backbone=trunk, preprocessor=None)


def whisper():
    trunk = _hub().WhisperBackbone(
        **TEXT,
        num_heads=2,
        num_mels=IMAGE,
        max_encoder_sequence_length=IMAGE,
        max_decoder_sequence_length=4,
    )
    out = trunk(trunk.input)["decoder_sequence_output"]
    return _head(trunk, out, VOCABULARY)


def moonshine():
    models = _hub()
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


_GEMMA = {"num_query_heads": 2, "num_key_value_heads": 1, "head_dim": 16}
_SMOL = {
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "rope_layer_enabled_list": [True, True],
    "layer_types": ["attention", "attention"],
    "mlp_bias": False,
    "layer_norm_epsilon": 1e-6,
    "max_position_embeddings": SEQUENCE,
    "rope_theta": 10000.0,
    "partial_rotary_factor": 1.0,
}
_T5GEMMA = {
    "vocabulary_size": VOCABULARY,
    **{
        f"{side}_{key}": value
        for side in ("encoder", "decoder")
        for key, value in {
            "hidden_dim": 32,
            "intermediate_dim": 64,
            "num_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "layer_types": ["full_attention"],
        }.items()
    },
}
FAMILIES: dict[str, Family] = {
    # Text classifiers.
    "bert": Family("text", classifier("BertTextClassifier", "BertBackbone")),
    "distil_bert": Family("text", classifier("DistilBertTextClassifier", "DistilBertBackbone")),
    "roberta": Family("text", classifier("RobertaTextClassifier", "RobertaBackbone")),
    "xlm_roberta": Family("text", classifier("XLMRobertaTextClassifier", "XLMRobertaBackbone")),
    "albert": Family(
        "text", classifier("AlbertTextClassifier", "AlbertBackbone", embedding_dim=32)
    ),
    "deberta_v3": Family(
        "text", classifier("DebertaV3TextClassifier", "DebertaV3Backbone", bucket_size=8)
    ),
    "electra": Family("text", electra, SPARSE),
    "f_net": Family(
        "text",
        classifier("FNetTextClassifier", "FNetBackbone", num_heads=None),
    ),
    "roformer_v2": Family(
        "text",
        classifier(
            "RoformerV2TextClassifier", "RoformerV2Backbone", head_size=16, max_sequence_length=None
        ),
    ),
    "xlnet": Family("text", xlnet, SPARSE),
    "esm2": Family("text", classifier("ESMProteinClassifier", "ESM2Backbone")),
    # Causal LMs.
    "gpt2": Family(
        "causal_lm",
        causal_lm("GPT2", **TEXT, num_heads=2, dropout=0.0, max_sequence_length=SEQUENCE),
    ),
    "gemma": Family("causal_lm", causal_lm("Gemma", **TEXT, **_GEMMA)),
    "gemma3": Family("causal_lm", causal_lm("Gemma3", **TEXT, **_GEMMA, image_size=IMAGE)),
    "llama": Family("causal_lm", causal_lm("Llama", **DECODER)),
    "llama3": Family("causal_lm", causal_lm("Llama3", **DECODER)),
    "mistral": Family("causal_lm", causal_lm("Mistral", **DECODER)),
    "mixtral": Family("causal_lm", causal_lm("Mixtral", **DECODER, num_experts=2)),
    "opt": Family(
        "causal_lm",
        causal_lm("OPT", **TEXT, num_heads=2, dropout=0.0, max_sequence_length=SEQUENCE),
    ),
    "qwen": Family("causal_lm", causal_lm("Qwen", **DECODER)),
    "qwen2": Family("causal_lm", causal_lm("Qwen2", **DECODER)),
    "qwen3": Family("causal_lm", causal_lm("Qwen3", **DECODER, head_dim=16)),
    "qwen_moe": Family(
        "causal_lm",
        causal_lm(
            "QwenMoe",
            **DECODER,
            moe_intermediate_dim=32,
            shared_expert_intermediate_dim=32,
            num_experts=2,
            top_k=1,
        ),
    ),
    "qwen3_moe": Family(
        "causal_lm",
        causal_lm(
            "Qwen3Moe", **DECODER, moe_intermediate_dim=32, num_experts=2, top_k=1, head_dim=16
        ),
    ),
    "phi3": Family("causal_lm", causal_lm("Phi3", **DECODER, max_sequence_length=SEQUENCE)),
    "bloom": Family("causal_lm", causal_lm("Bloom", **TEXT, num_heads=2)),
    "gpt_neo_x": Family(
        "causal_lm", causal_lm("GPTNeoX", **TEXT, num_heads=2, max_sequence_length=SEQUENCE)
    ),
    "falcon": Family("causal_lm", causal_lm("Falcon", **TEXT, num_attention_heads=2)),
    "smollm3": Family("causal_lm", causal_lm("SmolLM3", **TEXT, **_SMOL)),
    "rwkv7": Family(
        "causal_lm",
        causal_lm(
            "RWKV7",
            hidden_size=32,
            head_size=16,
            num_layers=2,
            vocabulary_size=VOCABULARY,
            intermediate_dim=64,
            gate_lora=8,
            mv_lora=8,
            aaa_lora=8,
            decay_lora=8,
        ),
    ),
    "gpt_oss": Family("causal_lm", causal_lm("GptOss", **DECODER, num_experts=2, head_dim=16)),
    # Seq2seq LMs.
    "t5": Family(
        "seq2seq",
        seq2seq("T5", **TEXT, num_heads=2, key_value_dim=16, dropout=0.0),
    ),
    "bart": Family(
        "seq2seq",
        seq2seq("Bart", **TEXT, num_heads=2, dropout=0.0, max_sequence_length=SEQUENCE),
    ),
    "t5_gemma": Family("seq2seq", seq2seq("T5Gemma", **_T5GEMMA)),
    # Image classifiers.
    "vit": Family(
        "image",
        image_classifier(
            "ViT",
            image_shape=(IMAGE, IMAGE, 3),
            patch_size=8,
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            mlp_dim=64,
        ),
    ),
    "deit": Family(
        "image",
        image_classifier(
            "DeiT",
            image_shape=(IMAGE, IMAGE, 3),
            patch_size=8,
            num_layers=2,
            num_heads=2,
            hidden_dim=32,
            intermediate_dim=64,
        ),
    ),
    "swin": Family(
        "image",
        image_classifier(
            "SwinTransformer",
            image_shape=(IMAGE, IMAGE, 3),
            embed_dim=16,
            depths=(1, 1),
            num_heads=(1, 2),
            window_size=4,
            patch_size=2,
            drop_path=0.0,
        ),
    ),
    "resnet": Family("image", lambda: _hub().ResNetImageClassifier(_resnet(), CLASSES)),
    "efficientnet": Family(
        "image",
        image_classifier(
            "EfficientNet",
            stackwise_kernel_sizes=[3, 3],
            stackwise_num_repeats=[1, 1],
            stackwise_input_filters=[16, 16],
            stackwise_output_filters=[16, 24],
            stackwise_expansion_ratios=[1, 4],
            stackwise_squeeze_and_excite_ratios=[0.25, 0.25],
            stackwise_strides=[1, 2],
            stackwise_block_types=["v1", "v1"],
            stackwise_force_input_filters=[0, 0],
            stackwise_nores_option=[False, False],
            stackwise_width_coefficients=[1.0, 1.0],
            stackwise_depth_coefficients=[1.0, 1.0],
            dropout=0.0,
            num_features=64,
            input_shape=(IMAGE, IMAGE, 3),
        ),
    ),
    "densenet": Family(
        "image",
        image_classifier(
            "DenseNet", stackwise_num_repeats=[1, 1], image_shape=(IMAGE, IMAGE, 3), growth_rate=8
        ),
    ),
    "mit": Family("image", lambda: _hub().MiTImageClassifier(_mit(), CLASSES)),
    "cspnet": Family(
        "image",
        image_classifier(
            "CSPNet",
            stem_filters=16,
            stem_kernel_size=3,
            stem_strides=2,
            stackwise_depth=[1, 1],
            stackwise_strides=[1, 2],
            stackwise_num_filters=[32, 64],
            block_type="dark_block",
            stage_type="dark",
            image_shape=(IMAGE, IMAGE, 3),
        ),
    ),
    "vgg": Family(
        "image",
        image_classifier(
            "VGG",
            stackwise_num_repeats=[1, 1],
            stackwise_num_filters=[16, 32],
            image_shape=(IMAGE, IMAGE, 3),
            head={"pooling_hidden_dim": 32},
        ),
    ),
    "xception": Family(
        "image",
        image_classifier(
            "Xception",
            stackwise_conv_filters=[[16, 16], [32, 32]],
            stackwise_pooling=[False, True],
            image_shape=(IMAGE, IMAGE, 3),
        ),
    ),
    "dinov2": Family("image", dinov2, SPARSE),
    # Segmenters.
    "deeplab_v3": Family("segmentation_one_hot", deeplab_v3),
    "segformer": Family("segmentation_one_hot", segformer),
    "basnet": Family("saliency", basnet),
    # Audio.
    "whisper": Family("whisper", whisper, SPARSE),
    "moonshine": Family("moonshine", moonshine),
}


def _words(text: bytes) -> np.ndarray:
    """`text`'s words, each hashed into the vocabulary (ids 2 and up)."""
    words = re.findall(r"\w+|[^\w\s]", text.decode("utf-8"))
    return np.array([2 + zlib.crc32(w.encode()) % (VOCABULARY - 2) for w in words], np.int32)


@functools.cache
def _corpus(modules: tuple[str, ...]) -> np.ndarray:
    return _words(hub_tasks.standard_library_text(modules))


def _windows(modules, count: int, rng, length: int = SEQUENCE + 1) -> np.ndarray:
    ids = _corpus(modules)
    starts = rng.integers(0, len(ids) - length, count)
    return np.stack([ids[s : s + length] for s in starts])


@functools.cache
def _digits():
    from sklearn import datasets

    digits = datasets.load_digits()
    images = (digits.images / 16.0).astype(np.float32)
    big = np.repeat(np.repeat(images, 4, axis=1), 4, axis=2)  # 8x8 -> 32x32
    return big, digits.target.astype(np.int32)


def data(kind: str, split: str = "train"):
    """`(x, y)` for family kind `kind`: 160 training or 32 held-out examples."""
    count = TRAIN if split == "train" else HELD_OUT
    rng = np.random.default_rng(0 if split == "train" else 1)
    if kind in ("text", "causal_lm", "seq2seq"):
        half = count // 2
        tokens = np.concatenate(
            [
                _windows(hub_tasks.PRETRAINING_MODULES, half, rng),
                _windows(hub_tasks.FINE_TUNING_MODULES, count - half, rng),
            ]
        )
        labels = np.repeat([0, 1], [half, count - half]).astype(np.int32)
        order = rng.permutation(count)
        tokens, labels = tokens[order], labels[order]
        mask = np.ones((count, SEQUENCE), bool)
        if kind == "text":
            x = {"token_ids": tokens[:, :-1], "padding_mask": mask}
            x["segment_ids"] = np.zeros((count, SEQUENCE), np.int32)
            return x, labels
        if kind == "causal_lm":
            return {"token_ids": tokens[:, :-1], "padding_mask": mask}, tokens[:, 1:]
        x = {
            "encoder_token_ids": tokens[:, :-1],
            "encoder_padding_mask": mask,
            "decoder_token_ids": tokens[:, :-1],
            "decoder_padding_mask": mask,
        }
        return x, tokens[:, 1:]
    images, labels = _digits()
    rows = slice(0, count) if split == "train" else slice(TRAIN, TRAIN + count)
    images, labels = images[rows], labels[rows]
    if kind == "image":
        return np.repeat(images[..., None], 3, -1), labels
    if kind.startswith("segmentation"):
        masks = np.where(images > 0.25, labels[:, None, None] + 1, 0).astype(np.int32)
        if kind.endswith("one_hot"):  # the segmenters' own loss takes one-hot masks
            return np.repeat(images[..., None], 3, -1), np.eye(CLASSES + 1, dtype=np.float32)[masks]
        return np.repeat(images[..., None], 3, -1), masks[..., None]
    if kind == "saliency":
        return np.repeat(images[..., None], 3, -1), (images > 0.25).astype(np.float32)[..., None]
    # Audio: transcribe the digit as the word of its class: [start, class word].
    words = np.stack([np.ones_like(labels), 2 + labels], -1).astype(np.int32)
    if kind == "whisper":
        x = {
            "encoder_features": images,
            "decoder_token_ids": np.concatenate([words, np.zeros((count, 2), np.int32)], -1),
            "decoder_padding_mask": np.array([[1, 1, 0, 0]] * count, np.int32),
        }
        return x, np.concatenate([words[:, 1:], np.zeros((count, 3), np.int32)], -1)
    audio = images.reshape(count, -1, 1)
    x = {
        "encoder_input_values": audio,
        "encoder_padding_mask": np.ones(audio.shape[:2], bool),
        "decoder_token_ids": words,
        "decoder_padding_mask": np.ones((count, 2), bool),
    }
    return x, np.concatenate([words[:, 1:], np.zeros((count, 1), np.int32)], -1)


def inputs_for(model: keras.Model, x):
    """`x` restricted to the inputs `model` takes (a backbone may not take
    `segment_ids` or a padding mask)."""
    if not isinstance(x, dict):
        return x
    names = getattr(model, "input", None)
    if isinstance(names, dict):
        return {k: v for k, v in x.items() if k in names}
    return x
