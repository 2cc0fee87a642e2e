"""The families: tiny KerasHub models from their constructors, and the data each trains on.

`FAMILIES[name]` is a `Family`: its kind (which data it takes) and a builder
that returns a compiled-ready model. Builders import keras_hub lazily; the
data (`data(kind, split)`) comes from the standard library's docstrings and
scikit-learn's digits (see the plan in the package docstring).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras

from benchmarks.keras_hub_families.batches import CLASSES, IMAGE, SEQUENCE, VOCABULARY
from benchmarks.keras_hub_families.builders import (
    DECODER,
    SPARSE,
    TEXT,
    basnet,
    causal_lm,
    classifier,
    deeplab_v3,
    dinov2,
    electra,
    hub,
    image_classifier,
    mit_backbone,
    moonshine,
    resnet_backbone,
    segformer,
    seq2seq,
    whisper,
    xlnet,
)


@dataclasses.dataclass(frozen=True)
class Family:
    """One family: `kind` names its data (`data`), `build` returns the model;
    `loss` is passed to `compile` (None: the task's own)."""

    kind: str
    build: Callable[[], keras.Model]
    loss: object = None


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
    "resnet": Family("image", lambda: hub().ResNetImageClassifier(resnet_backbone(), CLASSES)),
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
    "mit": Family("image", lambda: hub().MiTImageClassifier(mit_backbone(), CLASSES)),
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
