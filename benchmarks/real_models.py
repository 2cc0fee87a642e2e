"""Real architectures: keras.applications and KerasHub models, built offline.

The models users train, not ones written here: keras.applications MobileNetV2
and ResNet50V2 (`weights=None`, 32x32 inputs) and tiny KerasHub GPT-2 and BERT
backbones built from their constructors (no download), each under a small head
with float32 outputs. The test suite (`tests/test_real_models.py`) and the
benchmark's real-model section build them from here.

`python -m benchmarks.real_models [--steps N] [--models a,b]` trains each model
under mixed_float16 with XLA, with Keras's `LossScaleOptimizer` and with
keras_als on the same weights and batches, and prints the skipped steps (in the
first 50 steps and after), compile time and step time of keras_als over Keras's
(interleaved, median of many steps) and XLA step memory (each configuration in
a fresh process, see `benchmarks.memory`). It writes
benchmarks/results/real_models.json and .md.

Targets (issue 12): skipped steps in the first 50 at most Keras's, and at most
1 per 1000 after; step time <= 1.03x, compile time <= 1.25x and XLA step memory
<= 1.05x Keras's.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_als  # noqa: E402
from benchmarks import memory  # noqa: E402

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
    base = keras.applications.ResNet50V2(weights=None, input_shape=(32, 32, 3), include_top=False)
    return _image_head(base)


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

    backbone = keras_hub.models.GPT2Backbone(**TINY_BACKBONE)
    return _text_head(backbone, keras.layers.GlobalAveragePooling1D()(backbone(backbone.input)))


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


def data(name: str, batches: int, seed: int = 0):
    """`batches` batches of inputs and labels for model `name` (fixed by `seed`)."""
    rng = np.random.default_rng(seed)
    n = batches * BATCH
    if name in ("mobilenet_v2", "resnet50_v2"):
        return rng.normal(size=(n, 32, 32, 3)).astype("float32"), rng.integers(0, 10, n)
    x = {
        "token_ids": rng.integers(1, VOCABULARY, size=(n, SEQUENCE)).astype("int32"),
        "padding_mask": np.ones((n, SEQUENCE), "int32"),
    }
    if name == "bert_tiny":
        x["segment_ids"] = np.zeros((n, SEQUENCE), "int32")
    return x, rng.integers(0, 2, n)


def batch(x, i: int):
    """Batch `i` of inputs `x` (an array or a dict of arrays)."""
    return keras.tree.map_structure(lambda a: a[i * BATCH : (i + 1) * BATCH], x)


def build(name: str, method: str, seed: int = 0, policy: str = "mixed_float16"):
    """Model `name` for `method` ("keras" or "keras_als") and its optimizer, compiled."""
    keras.config.set_dtype_policy(policy)
    keras.utils.set_random_seed(seed)
    model = MODELS[name]()
    if method == "keras_als":
        model = keras_als.wrap_model(model)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    else:
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        jit_compile=True,
    )
    return model, optimizer


def skipped(optimizer, steps: int) -> int:
    """Steps skipped so far by either optimizer, after `steps` steps."""
    if isinstance(optimizer, keras_als.AdaptiveLossScaleOptimizer):
        return int(optimizer.skipped_steps.numpy())
    return steps - int(optimizer.iterations.numpy())


def skip_trace(name: str, method: str, steps: int, seed: int = 0) -> list[int]:
    """Skipped steps after each of `steps` training steps (same weights and batches)."""
    model, optimizer = build(name, method, seed)
    x, y = data(name, steps, seed)
    trace = []
    for i in range(steps):
        model.train_on_batch(batch(x, i), y[i * BATCH : (i + 1) * BATCH])
        trace.append(skipped(optimizer, i + 1))
    return trace


def timing(name: str, rounds: int = 30, seed: int = 0) -> dict:
    """Compile time and median step time of both methods, steps interleaved."""
    x, y = data(name, 1, seed)
    built, compile_seconds = {}, {}
    for method in ("keras", "keras_als"):
        model, _ = build(name, method, seed)
        start = time.perf_counter()
        model.train_on_batch(x, y)  # traces and compiles
        compile_seconds[method] = time.perf_counter() - start
        built[method] = model
    times = {"keras": [], "keras_als": []}
    for _ in range(rounds):
        for method in ("keras", "keras_als"):
            start = time.perf_counter()
            built[method].train_on_batch(x, y)
            times[method].append(time.perf_counter() - start)
    median = {m: statistics.median(t) for m, t in times.items()}
    return {
        "compile_ratio": compile_seconds["keras_als"] / compile_seconds["keras"],
        "step_ratio": median["keras_als"] / median["keras"],
        "compile_seconds": compile_seconds,
        "step_seconds": median,
    }


def memory_of(name: str, method: str) -> dict:
    """XLA step memory and peak RSS of one configuration, in a fresh process."""
    command = [sys.executable, "-m", "benchmarks.real_models", "--probe", name, method]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"memory probe {name} {method} failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def _probe(name: str, method: str) -> None:
    """Subprocess entry: five XLA steps, then one JSON line of memory figures."""
    with tempfile.TemporaryDirectory(prefix="keras_als_xla_") as dump:
        os.environ["XLA_FLAGS"] = (
            f"--xla_dump_to={dump} --xla_dump_hlo_as_text "
            "--xla_dump_hlo_module_re=.*one_step_on_data.*"
        )
        model, _ = build(name, method)
        x, y = data(name, 1)
        before = memory.high_water_mb()
        for _ in range(5):
            model.train_on_batch(x, y)
        peak = memory.high_water_mb()
        xla_bytes = memory.xla_total(dump, "one_step_on_data")
    print(json.dumps({"xla_bytes": xla_bytes, "peak_rss_mb": peak, "before_mb": before}))


def verdicts(row: dict, steps: int) -> dict:
    """PASS/FAIL per target for one model's row."""
    after = max(steps - 50, 1)
    return {
        "skips_first_50": row["keras_als"]["first_50"] <= row["keras"]["first_50"],
        "skips_after_50": row["keras_als"]["after_50"] <= max(1, after // 1000),
        "step_time": row["step_ratio"] <= 1.03,
        "compile_time": row["compile_ratio"] <= 1.25,
        "memory": row["memory_ratio"] <= 1.05,
    }


def markdown(results: dict) -> str:
    """The real-model table of RESULTS.md."""
    steps = results["steps"]
    lines = [
        "# Real architectures (issue 12)",
        "",
        f"mixed_float16, XLA, Adam 1e-3, batch {results['batch']}, {steps} steps, same "
        "weights and batches for both optimizers (`python -m benchmarks.real_models`).",
        "",
        "| model | skipped in first 50 (Keras / keras_als) | skipped after (Keras / keras_als) "
        "| step time | compile time | XLA step memory | targets missed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in results["models"].items():
        missed = [k for k, ok in verdicts(row, steps).items() if not ok]
        lines.append(
            f"| {name} | {row['keras']['first_50']} / {row['keras_als']['first_50']} "
            f"| {row['keras']['after_50']} / {row['keras_als']['after_50']} "
            f"| {row['step_ratio']:.3f}x | {row['compile_ratio']:.3f}x "
            f"| {row['memory_ratio']:.3f}x | {', '.join(missed) or 'none'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--out", default="benchmarks/results/real_models")
    parser.add_argument("--probe", nargs=2, metavar=("MODEL", "METHOD"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        _probe(*args.probe)
        return
    rows = {}
    for name in args.models.split(","):
        row = {}
        for method in ("keras", "keras_als"):
            keras.utils.clear_session()
            trace = skip_trace(name, method, args.steps)
            first = trace[min(49, len(trace) - 1)]
            row[method] = {"first_50": first, "after_50": trace[-1] - first}
        keras.utils.clear_session()
        row.update(timing(name))
        used = {method: memory_of(name, method) for method in ("keras", "keras_als")}
        row["memory"] = used
        row["memory_ratio"] = used["keras_als"]["xla_bytes"] / used["keras"]["xla_bytes"]
        rows[name] = row
        missed = [k for k, ok in verdicts(row, args.steps).items() if not ok]
        print(
            f"{name:14s} skipped in first 50: keras {row['keras']['first_50']:3d}, "
            f"keras_als {row['keras_als']['first_50']:3d}; after: keras "
            f"{row['keras']['after_50']}, keras_als {row['keras_als']['after_50']} "
            f"(of {args.steps - 50}); step time {row['step_ratio']:.3f}x, "
            f"compile time {row['compile_ratio']:.3f}x, XLA step memory "
            f"{row['memory_ratio']:.3f}x; missed: {', '.join(missed) or 'none'}",
            flush=True,
        )
    results = {"steps": args.steps, "batch": BATCH, "models": rows}
    with open(args.out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    with open(args.out + ".md", "w") as f:
        f.write(markdown(results))


if __name__ == "__main__":
    tf.get_logger().setLevel("ERROR")
    main()
