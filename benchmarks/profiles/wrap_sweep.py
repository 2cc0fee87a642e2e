"""Wrap and train many more KerasHub backbones and keras.applications models.

The real-model suite (`benchmarks.real_models`) measures twelve models in
depth; this sweep tries many more of the same families, briefly, as a new user
would. For each model, built offline (`weights=None` applications at 32x32
under a pooling + Dense head; KerasHub text backbones at a tiny size from their
constructors, mean-pooled):

1. float32: `wrap_model` instruments the model in place, keeping every weight
   object in its order, and its traced outputs equal those of a plain model
   built the same way with the same weights, within float32 rounding (1e-6);
2. mixed_float16, XLA, Adam, batch 8: `--steps` steps with keras_als and with
   Keras's `LossScaleOptimizer` from the same weights on the same batches;
   the skipped steps of each, and how many of its weights hold a value that
   is not finite at the end (Keras 3.15's optimizer applies a non-finite
   embedding row next to a finite row of the same token: see
   `tests/test_faults.py`).

`python -m benchmarks.profiles wrap_sweep [--steps N] [--models a,b]` (50 steps by
default: the first 50 are issue 12's skip target) prints a table and
writes benchmarks/results/wrap_sweep.md. A model that fails says where: in
KerasHub itself (Keras's optimizer fails on it too), or in keras_als.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_als  # noqa: E402
from benchmarks.harness.scaling import prebuild  # noqa: E402
from benchmarks.real_models.architectures import SEQUENCE, VOCABULARY, mean_pooled  # noqa: E402

APPLICATIONS = (
    "MobileNet",
    "MobileNetV3Large",
    "VGG16",
    "ResNet50",
    "ResNet101V2",
    "DenseNet169",
    "EfficientNetB3",
    "EfficientNetV2B0",
    "ConvNeXtSmall",
    "NASNetMobile",
    "Xception",
    "InceptionV3",
)
"""keras.applications models, beyond the twelve of `benchmarks.real_models`."""

INPUT_SIZE = {"Xception": 71, "InceptionV3": 75}
"""Applications whose smallest input is larger than 32x32."""

BACKBONES = (
    "LlamaBackbone",
    "Llama3Backbone",
    "MistralBackbone",
    "Qwen2Backbone",
    "Qwen3Backbone",
    "Phi3Backbone",
    "Gemma3Backbone",
    "GptOssBackbone",
    "GPTNeoXBackbone",
    "FalconBackbone",
    "BloomBackbone",
    "ElectraBackbone",
    "AlbertBackbone",
    "DebertaV3Backbone",
    "XLMRobertaBackbone",
    "XLNetBackbone",
    "FNetBackbone",
    "MixtralBackbone",
    "ESM2Backbone",
)
"""KerasHub text backbones, beyond the six of `benchmarks.real_models`."""

TINY = {
    "vocabulary_size": VOCABULARY,
    "vocab_size": VOCABULARY,
    "num_layers": 2,
    "num_heads": 2,
    "num_query_heads": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "hidden_dim": 32,
    "intermediate_dim": 64,
    "head_dim": 16,
    "embedding_dim": 16,
    "num_groups": 1,
    "num_inner_repetitions": 1,
    "bucket_size": 8,
    "num_experts": 2,
    "top_k": 1,
    "num_experts_per_tok": 1,
    "image_size": None,
    "max_sequence_length": SEQUENCE,
}
"""Constructor arguments of a tiny text backbone, by name; each backbone takes
the ones its constructor has."""


def tiny_backbone(name: str) -> keras.Model:
    """KerasHub's backbone class `name`, built at the tiny size of `TINY`.

    Example:

    >>> backbone = tiny_backbone("GPT2Backbone")
    >>> backbone.num_layers, backbone.hidden_dim
    (2, 32)
    """
    import keras_hub

    backbone_class = getattr(keras_hub.models, name)
    parameters = inspect.signature(backbone_class.__init__).parameters
    missing = [
        p
        for p, spec in parameters.items()
        if spec.default is inspect.Parameter.empty
        and spec.kind is spec.POSITIONAL_OR_KEYWORD
        and p not in TINY
        and p != "self"
    ]
    if missing:
        raise TypeError(f"{name} needs {missing}, which TINY has no value for.")
    return backbone_class(**{k: v for k, v in TINY.items() if k in parameters})


def application(name: str) -> keras.Model:
    """keras.applications' `name` (`weights=None`) under pooling and Dense(10, float32)."""
    size = INPUT_SIZE.get(name, 32)
    base = getattr(keras.applications, name)(
        weights=None, include_top=False, input_shape=(size, size, 3)
    )
    inputs = keras.Input((size, size, 3))
    features = keras.layers.GlobalAveragePooling2D()(base(inputs))
    return keras.Model(inputs, keras.layers.Dense(10, dtype="float32")(features))


def batches(model: keras.Model, count: int, seed: int = 0) -> list:
    """`count` batches of 8 for `model`: images (10 classes) or tokens (2 classes)."""
    rng = np.random.default_rng(seed)
    if not isinstance(model.input, dict):
        shape = (8, *model.input.shape[1:])
        return [
            (rng.normal(size=shape).astype("float32"), rng.integers(0, 10, 8)) for _ in range(count)
        ]

    def inputs():
        x = {}
        for key, spec in model.input.items():
            shape = (8, *(d or SEQUENCE for d in spec.shape[1:]))
            if "mask" in key:
                x[key] = np.ones(shape, spec.dtype)
            elif "segment" in key:
                x[key] = np.zeros(shape, spec.dtype)
            else:
                x[key] = rng.integers(1, VOCABULARY, shape).astype(spec.dtype)
        return x

    return [(inputs(), rng.integers(0, 2, 8)) for _ in range(count)]


def _skipped_training(model, optimizer, data) -> tuple[int, int]:
    """Trains `model` on `data` with XLA: its skipped steps, and its weights
    that hold a value that is not finite at the end (an optimizer that applied
    a non-finite gradient)."""
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    prebuild(model)
    for x, y in data:
        model.train_on_batch(x, y)
    skipped = len(data) - int(optimizer.inner_optimizer.iterations.numpy())
    return skipped, sum(not np.isfinite(w).all() for w in model.get_weights())


def try_model(make, steps: int) -> dict:
    """Wraps and trains the model `make()` builds (see the module docstring)."""
    row = {}
    try:
        keras.config.set_dtype_policy("float32")
        keras.utils.set_random_seed(0)
        model = make()
        keras.utils.set_random_seed(0)
        reference = make()  # plain, with the same weights
        reference.set_weights(model.get_weights())
        weights = list(model.weights)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped = keras_als.wrap_model(model)
        row["warnings"] = len(caught)  # wrap_model's (none expected)
        row["weights_equal"] = wrapped is model and all(
            a is b for a, b in zip(model.weights, weights, strict=True)
        )
        data = batches(model, steps)
        x = data[0][0]
        # Traced: the boundaries exist only in traced functions.
        outputs = [tf.function(lambda x, m=m: m(x))(x) for m in (wrapped, reference)]
        row["outputs_equal"] = bool(np.allclose(*map(np.asarray, outputs), rtol=1e-6, atol=1e-6))
        keras.config.set_dtype_policy("mixed_float16")
        keras.utils.set_random_seed(0)
        plain = make()
        weights = plain.get_weights()
        try:
            keras.utils.set_random_seed(0)
            reference = make()
            reference.set_weights(weights)
            keras_optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
            row["keras"], keras_not_finite = _skipped_training(reference, keras_optimizer, data)
        except Exception as error:
            row["error"] = f"fails with Keras's optimizer too: {type(error).__name__}"
            return row
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wrapped = keras_als.wrap_model(plain)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
        row["keras_als"], not_finite = _skipped_training(wrapped, optimizer, data)
        row["weights_not_finite"] = {"keras": keras_not_finite, "keras_als": not_finite}
        row["scales"] = len(optimizer.layer_scales())
    except Exception as error:
        row["error"] = f"keras_als: {type(error).__name__}: {str(error)[:200]}"
    finally:
        keras.config.set_dtype_policy("float32")
    return row


def markdown(rows: dict, steps: int) -> str:
    lines = [
        "# Many more models, briefly: wrap and train (`benchmarks.profiles.wrap_sweep`)",
        "",
        f"{steps} steps per model (`python -m benchmarks.profiles wrap_sweep --steps {steps}`); "
        "mixed_float16, XLA, Adam 1e-3, batch 8, the same weights and batches for both.",
        "",
        "| model | weights kept | outputs equal | warnings | scales "
        "| skipped: Keras LSO / keras_als | weights not finite at the end: Keras LSO / "
        "keras_als |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        if "error" in row and "keras_als" not in row:
            lines.append(
                f"| {name} | {row.get('weights_equal', '')} "
                f"| {row.get('outputs_equal', '')} | | | {row['error']} | |"
            )
            continue
        not_finite = row.get("weights_not_finite")
        not_finite = f"{not_finite['keras']} / {not_finite['keras_als']}" if not_finite else "-"
        lines.append(
            f"| {name} | {row['weights_equal']} | {row['outputs_equal']} "
            f"| {row['warnings']} | {row['scales']} | {row['keras']} / {row['keras_als']} "
            f"| {not_finite} |"
        )
    return "\n".join(lines) + "\n"


def _maker(name: str):
    if name.endswith("Backbone"):
        return lambda: mean_pooled(tiny_backbone(name))
    return lambda: application(name)


def _in_fresh_process(name: str, steps: int) -> dict:
    """`try_model` of `name` in a process of its own: compiled steps of many
    large models in one process add up past the machine's memory."""
    command = [sys.executable, "-m", "benchmarks.profiles.wrap_sweep", "--one", name]
    done = subprocess.run(command + ["--steps", str(steps)], capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": f"the process ended with code {done.returncode} (out of memory?)"}
    return json.loads(lines[-1])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="the first 50: issue 12's target")
    parser.add_argument("--models", default=",".join(BACKBONES + APPLICATIONS))
    parser.add_argument("--out", default="benchmarks/results/wrap_sweep.md")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(try_model(_maker(args.one), args.steps)))
        return
    rows = {}
    for name in args.models.split(","):
        rows[name] = _in_fresh_process(name, args.steps)
        print(name, rows[name], flush=True)
    table = markdown(rows, args.steps)
    print(table)
    with open(args.out, "w") as f:
        f.write(table)


if __name__ == "__main__":
    main()
