"""One run: a setting, a method and a seed, trained with `model.fit`; and every run."""

from __future__ import annotations

import dataclasses
import time

import keras
import numpy as np

import keras_als
from benchmarks.harness import isolation, scaling, zoo
from benchmarks.heavy_tails.plan import METHODS, Setting, digits_data, teacher_mlp, teacher_mlp_data


def optimizer_for(method: str, inner: keras.optimizers.Optimizer):
    """The optimizer `method` trains with, around `inner`."""
    if method in ("float32", "mixed_no_scaling"):
        return inner
    if method == "keras_lso":
        return keras.optimizers.LossScaleOptimizer(inner)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(inner)
    optimizer.estimate_underflow = True  # telemetry's underflow_rate / zero_rate
    return optimizer


@dataclasses.dataclass
class Run:
    """One training run.

    Attributes:
        setting: Setting name.
        method: Method name.
        seed: Seed of the initial weights and of the row order.
        outcome: Held-out MSE (MLP) or accuracy (CNN); NaN if not finite.
        steps: Training steps run.
        skipped: Steps run minus `optimizer.iterations`.
        skipped_steps: For keras_als, its own `skipped_steps` counter (else None).
        skipped_at: Indices (from 0) of the skipped steps.
        spike_batches: Steps whose batch held a spiked sample.
        skipped_in_spike_batches: Skipped steps whose batch held a spiked sample.
        finite_weights: Whether every weight is finite at the end.
        seconds: Wall time of fit and evaluation (compile included).
        telemetry: keras_als's `optimizer.telemetry()` at the end (else {}).
        scale: Keras LSO's scale at the end (else None).
    """

    setting: str
    method: str
    seed: int
    outcome: float
    steps: int
    skipped: int
    skipped_steps: int | None
    skipped_at: list[int]
    spike_batches: int
    skipped_in_spike_batches: int
    finite_weights: bool
    seconds: float
    telemetry: dict = dataclasses.field(default_factory=dict)
    scale: float | None = None


class _SkipRecorder(keras.callbacks.Callback):
    """Notes after every batch whether the optimizer applied it."""

    def __init__(self, optimizer):
        super().__init__()
        self.optimizer_ = optimizer
        self.steps = 0
        self.skipped_at: list[int] = []

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1
        if scaling.skipped_steps(self.optimizer_, self.steps) > len(self.skipped_at):
            self.skipped_at.append(self.steps - 1)


def train(setting: Setting, method: str, seed: int) -> Run:
    """Trains `setting`'s model with `method` from seed `seed`; returns the run."""
    isolation.fresh_session()
    if setting.kind == "mlp":
        x, y, x_test, y_test, spiked = teacher_mlp_data(setting)
        loss, weights_of = "mse", None

        def builder():
            return teacher_mlp(setting.layers, setting.width)
    else:
        x, y, x_test, y_test, spiked = digits_data(setting)
        builder = zoo.digits_cnn
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        weights_of = np.where(spiked, setting.factor, 1.0).astype("float32")
    whole = len(x) // setting.batch * setting.batch
    order = np.random.default_rng(1000 + seed).permutation(len(x))[:whole]
    x, y, spiked = x[order], y[order], spiked[order]
    sample_weight = None if weights_of is None else weights_of[order]
    per_batch = spiked.reshape(-1, setting.batch).any(axis=1)
    spike_steps = np.tile(per_batch, setting.epochs)

    isolation.set_seed(seed)
    with scaling.precision("float32"):
        weights = builder().get_weights()
    with scaling.precision("float32" if method == "float32" else "mixed_float16"):
        model = builder()
        model.set_weights(weights)
        if method == "keras_als":
            model = keras_als.wrap_model(model)
    optimizer = optimizer_for(method, keras.optimizers.Adam(setting.learning_rate))
    # auto_scale_loss=False: else compile wraps the plain Adam of mixed_no_scaling
    # in a LossScaleOptimizer (the other methods pass one already).
    model.compile(optimizer=optimizer, loss=loss, jit_compile=True, auto_scale_loss=False)
    loss_scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert loss_scaled == (method in ("keras_lso", "keras_als")), (method, model.optimizer)
    recorder = _SkipRecorder(optimizer)
    isolation.set_seed(seed)
    start = time.perf_counter()
    model.fit(
        x,
        y,
        sample_weight=sample_weight,
        batch_size=setting.batch,
        epochs=setting.epochs,
        shuffle=False,
        verbose=0,
        callbacks=[recorder],
    )
    predicted = model.predict(x_test, batch_size=1000, verbose=0).astype("float64")
    seconds = time.perf_counter() - start
    if setting.outcome == "loss":
        outcome = float(np.mean((predicted[:, 0] - y_test[:, 0]) ** 2))
    else:
        outcome = float(np.mean(np.argmax(predicted, axis=1) == y_test))
    if not np.all(np.isfinite(predicted)):
        outcome = float("nan")
    finite = all(np.all(np.isfinite(w)) for w in model.get_weights())
    skipped_steps = telemetry = scale = None
    if method == "keras_als":
        skipped_steps = int(keras.ops.convert_to_numpy(optimizer.skipped_steps))
        telemetry = optimizer.telemetry()
    elif method == "keras_lso":
        scale = float(keras.ops.convert_to_numpy(optimizer.dynamic_scale))
    return Run(
        setting.name,
        method,
        seed,
        outcome,
        recorder.steps,
        scaling.skipped_steps(optimizer, recorder.steps),
        skipped_steps,
        recorder.skipped_at,
        int(spike_steps.sum()),
        int(spike_steps[recorder.skipped_at].sum()),
        bool(finite),
        seconds,
        telemetry or {},
        scale,
    )


def run(settings, seeds, log=print) -> list[Run]:
    """Every setting x seed x method, one run at a time in a worker process."""
    runs = []
    with isolation.worker_pool() as pool:
        for setting in settings:
            for seed in seeds:
                for method in METHODS:
                    r = pool.submit(train, setting, method, seed).result()
                    outcome = (
                        f"MSE {r.outcome:.4g}"
                        if setting.outcome == "loss"
                        else f"accuracy {100 * r.outcome:.2f}%"
                    )
                    log(
                        f"  {setting.name:16s} seed {seed} {method:17s} {outcome}, skipped "
                        f"{r.skipped}/{r.steps} ({r.skipped_in_spike_batches} in spike batches), "
                        f"{r.seconds:.1f}s",
                        flush=True,
                    )
                    runs.append(r)
    return runs
