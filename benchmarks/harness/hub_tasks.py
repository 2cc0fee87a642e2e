"""Tiny KerasHub tasks, built from their constructors (no download), and their data.

The tasks users hold: an object detector (`RetinaNetObjectDetector`), causal
language models (`GPT2CausalLM`, `GemmaCausalLM`), a segmenter
(`DeepLabV3ImageSegmenter`), an image classifier (`ViTImageClassifier`) and an
encoder-decoder (`T5Seq2SeqLM`),
each at a size a CPU trains in seconds. The data is real and offline: digits
pasted into canvases (`benchmarks.detection.canvases`, from scikit-learn's digits) for
the image tasks, and the docstrings of Python's standard library, as bytes,
for the language models. The tests of KerasHub tasks build theirs here.
"""

from __future__ import annotations

import functools
import importlib
import inspect

import keras
import numpy as np

IMAGE = 48
"""Side of the detection canvases (`benchmarks.detection.canvases.CANVAS`), in pixels."""
MAX_BOXES = 3
"""Boxes per canvas, padded with label -1 (KerasHub's background class)."""
VOCABULARY = 256
"""The byte vocabulary of `keras_hub.tokenizers.ByteTokenizer`."""
SEQUENCE = 32
"""Tokens per language-model example."""


def _resnet_encoder(image_shape):
    import keras_hub

    return keras_hub.models.ResNetBackbone(
        input_conv_filters=[64],
        input_conv_kernel_sizes=[7],
        stackwise_num_filters=[64, 16, 16, 16],
        stackwise_num_blocks=[1, 1, 1, 1],
        stackwise_num_strides=[1, 2, 2, 2],
        block_type="bottleneck_block",
        use_pre_activation=False,
        image_shape=image_shape,
    )


def retinanet(
    num_classes: int = 10, min_level: int = 3, num_scales: int = 1, anchor_size: float = 1
) -> keras.Model:
    """A RetinaNet on a tiny ResNet: feature levels 3 and 4 (6x6 and 3x3 on a
    48x48 canvas), anchors of 8 and 16 pixels at three aspect ratios, as the
    pasted digits (8 to 20 pixels a side) need; boxes as pixel corners (`xyxy`).

    Example:

    >>> type(retinanet()).__name__
    'RetinaNetObjectDetector'
    """
    import keras_hub

    shape = (IMAGE, IMAGE, 3)
    backbone = keras_hub.models.RetinaNetBackbone(
        image_encoder=_resnet_encoder(shape),
        min_level=min_level,
        max_level=4,
        use_p5=False,
        image_shape=shape,
    )
    anchors = keras_hub.layers.AnchorGenerator(
        "xyxy",
        min_level=min_level,
        max_level=4,
        num_scales=num_scales,
        aspect_ratios=[0.5, 1.0, 2.0],
        anchor_size=anchor_size,
    )
    return keras_hub.models.RetinaNetObjectDetector(
        backbone=backbone,
        num_classes=num_classes,
        bounding_box_format="xyxy",
        anchor_generator=anchors,
        pre_logits_num_conv_layers=1,
        preprocessor=None,
    )


def detection_data(split: str = "train", count: int | None = None):
    """`(images, {"boxes", "labels"})` of a split of the pasted digits, as a
    RetinaNet takes them: RGB canvases, pixel corner boxes, labels padded with -1."""
    from benchmarks.detection import canvases

    data = canvases.split(split)
    count = len(data.images) if count is None else count
    images = np.repeat(data.images[:count], 3, axis=-1)
    boxes = np.zeros((count, MAX_BOXES, 4), np.float32)
    labels = np.full((count, MAX_BOXES), -1.0, np.float32)
    for i in range(count):
        n = len(data.labels[i])
        boxes[i, :n] = data.boxes[i] * IMAGE
        labels[i, :n] = data.labels[i]
    return images, {"boxes": boxes, "labels": labels}


def gpt2_causal_lm() -> keras.Model:
    """A two-block GPT-2 causal LM over bytes (its output embedding is tied to its input's)."""
    import keras_hub

    backbone = keras_hub.models.GPT2Backbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=32,
        intermediate_dim=64,
        max_sequence_length=SEQUENCE,
        dropout=0.0,
    )
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def gemma_causal_lm() -> keras.Model:
    """A two-block Gemma causal LM over bytes (grouped-query attention, tied embeddings)."""
    import keras_hub

    backbone = keras_hub.models.GemmaBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_query_heads=2,
        num_key_value_heads=1,
        hidden_dim=32,
        intermediate_dim=64,
        head_dim=16,
        dropout=0.0,
    )
    return keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)


def t5_seq2seq_lm() -> keras.Model:
    """A one-block T5 encoder-decoder over bytes. Under mixed_float16 its
    attention's padding mask, `(1 - mask) * -1e9`, is -inf in float16 and
    0 * -inf is NaN: its output is not finite from the first step."""
    import keras_hub

    backbone = keras_hub.models.T5Backbone(
        vocabulary_size=VOCABULARY,
        num_layers=1,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        key_value_dim=8,
        dropout=0.0,
    )
    return keras_hub.models.T5Seq2SeqLM(backbone=backbone, preprocessor=None)


def seq2seq_batches(count: int, seed: int = 0):
    """`(x, y)` for `t5_seq2seq_lm`: byte windows of the standard library's
    docstrings, padded at the end (the encoder and decoder read the same
    window; `y` is it shifted by one token)."""
    x, y = text_batches(count, seed)
    rng = np.random.default_rng(seed)
    keep = np.arange(SEQUENCE)[None] < rng.integers(SEQUENCE // 2, SEQUENCE + 1, (count, 1))
    inputs = {
        "encoder_token_ids": x["token_ids"],
        "encoder_padding_mask": keep,
        "decoder_token_ids": x["token_ids"],
        "decoder_padding_mask": keep,
    }
    return inputs, y


def deeplab_v3(num_classes: int = 11) -> keras.Model:
    """A DeepLabV3 segmenter on a tiny ResNet (48x48 canvases; class 0 the background)."""
    import keras_hub

    shape = (IMAGE, IMAGE, 3)
    backbone = keras_hub.models.DeepLabV3Backbone(
        image_encoder=_resnet_encoder(shape),
        spatial_pyramid_pooling_key="P4",
        upsampling_size=4,
        dilation_rates=[1, 2],
        low_level_feature_key="P2",
        projection_filters=8,
        image_shape=shape,
    )
    return keras_hub.models.DeepLabV3ImageSegmenter(
        backbone=backbone, num_classes=num_classes, preprocessor=None
    )


def segmentation_data(count: int = 32):
    """`(images, masks)`: each pixel of a digit's box holds the digit's class + 1, else 0."""
    images, targets = detection_data("train", count)
    masks = np.zeros((count, IMAGE, IMAGE, 1), np.int32)
    for i in range(count):
        for box, label in zip(targets["boxes"][i], targets["labels"][i]):
            if label >= 0:
                x0, y0, x1, y1 = box.astype(int)
                masks[i, y0:y1, x0:x1, 0] = int(label) + 1
    return images, masks


def vit_classifier(num_classes: int = 10) -> keras.Model:
    """A three-block ViT classifier on 48x48 canvases (12x12 patches)."""
    import keras_hub

    backbone = keras_hub.models.ViTBackbone(
        image_shape=(IMAGE, IMAGE, 3),
        patch_size=12,
        num_layers=3,
        num_heads=2,
        hidden_dim=16,
        mlp_dim=32,
    )
    return keras_hub.models.ViTImageClassifier(
        backbone=backbone, num_classes=num_classes, preprocessor=None
    )


def classification_data(count: int = 32):
    """`(images, labels)`: the canvases, labelled by their first digit."""
    images, targets = detection_data("train", count)
    return images, targets["labels"][:, 0].astype(np.int32)


PRETRAINING_MODULES = (
    "argparse",
    "collections",
    "functools",
    "inspect",
    "json",
    "pathlib",
    "textwrap",
)
"""The modules whose docstrings the language models train on (`standard_library_text`)."""
FINE_TUNING_MODULES = ("email.message", "http.client", "logging", "typing", "unittest", "zipfile")
"""Other modules' docstrings: the text the LoRA fine-tuning study adapts a model to."""


@functools.cache
def standard_library_text(modules: tuple[str, ...] = PRETRAINING_MODULES) -> bytes:
    """The docstrings of the public callables of `modules`, in name order, as UTF-8 bytes."""
    parts = []
    for name in modules:
        module = importlib.import_module(name)
        for _, member in sorted(vars(module).items()):
            doc = inspect.getdoc(member) if callable(member) else None
            if doc:
                parts.append(doc)
    return "\n\n".join(parts).encode("utf-8")


def text_batches(count: int, seed: int = 0, length: int = SEQUENCE, text: bytes | None = None):
    """`(x, y)` for a causal LM: `count` byte windows of `text` (the standard
    library's docstrings by default) at random offsets, and each window's next
    byte at every position.

    Example:

    >>> x, y = text_batches(2)
    >>> x["token_ids"].shape, y.shape, bool((x["token_ids"][:, 1:] == y[:, :-1]).all())
    ((2, 32), (2, 32), True)
    """
    text = standard_library_text() if text is None else text
    data = np.frombuffer(text, np.uint8).astype(np.int32)
    starts = np.random.default_rng(seed).integers(0, len(data) - length - 1, count)
    tokens = np.stack([data[s : s + length + 1] for s in starts])
    x = {"token_ids": tokens[:, :-1], "padding_mask": np.ones((count, length), bool)}
    return x, tokens[:, 1:]
