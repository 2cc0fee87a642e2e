"""`ScaleMonitor`: per-layer scales, underflow and overflows in logs and TensorBoard."""

from __future__ import annotations

import keras
import tensorflow as tf

from keras_als.optimizer import AdaptiveLossScaleOptimizer
from keras_als.telemetry import _mistakes


class ScaleMonitor(keras.callbacks.Callback):
    """Shows what adaptive loss scaling does, while `fit` runs.

    Every batch it adds `scale_min`, `scale_max`, `skipped_steps`,
    `recent_skip_rate`, `skipped_in_a_row` and `scaling_stuck` (1.0 when the
    optimizer's stuck warning applies) to the logs, so the progress bar shows them (read every
    `every_n_steps` batches, so that reading costs little); at the end of each
    epoch it adds them, read afresh, to the epoch's logs (so `History` and
    `CSVLogger` keep them). Every
    `every_n_steps` batches it records, per wrapped layer and for the loss,
    the scale, the underflow rate (share of float16 subnormals), the share of
    exact zeros, the headroom learned from overflows and the count of
    overflows that started there, in `self.history` (keys `"step"`,
    `"scale/<layer>"`, `"underflow/<layer>"`, `"zeros/<layer>"`,
    `"headroom/<layer>"`, `"overflows/<layer>"`) and, with `log_dir`, as
    TensorBoard scalars of the same names. These five keys per layer stay out
    of the logs (hundreds of them on a ResNet, in the progress bar and every
    CSV row) unless `log_per_layer=True`, which adds them to each epoch's logs.
    When the scaling looks stuck (many skipped steps) it warns once, with
    the layers where the overflows started (see `optimizer.telemetry()`).

    It reads values the optimizer already keeps (a few scalars per layer), and
    turns on the optimizer's underflow counts, taken in the training step
    whenever it measures the scales (at most `measure_every_n_steps` steps
    apart), so the recorded rates are the latest such counts.

    Args:
        log_dir: Folder for TensorBoard event files, or None.
        every_n_steps: How often (in batches) to record per-layer values.
        log_per_layer: Whether each epoch's logs (and so `History`) also get
            the per-layer keys.

    Example:

    >>> import keras, numpy as np, keras_als
    >>> model = keras_als.wrap_model(keras.Sequential(
    ...     [keras.Input((4,)), keras.layers.Dense(1, name="out")]))
    >>> model.compile(keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD()), "mse")
    >>> monitor = keras_als.ScaleMonitor(every_n_steps=1)
    >>> history = model.fit(np.ones((8, 4)), np.ones((8, 1)), batch_size=4, verbose=0,
    ...                     callbacks=[monitor])
    >>> monitor.history["step"], sorted(k for k in monitor.history if k.startswith("scale/"))
    ([1, 2], ['scale/loss', 'scale/out'])
    >>> sorted(history.history)  # per epoch: no per-layer keys unless log_per_layer=True
    ['layers_beyond_float16', 'layers_needing_float32', 'loss', 'recent_skip_rate',
     'scale_max', 'scale_min', 'scaling_stuck', 'skipped_in_a_row', 'skipped_steps']
    """

    def __init__(
        self, log_dir: str | None = None, every_n_steps: int = 10, log_per_layer: bool = False
    ):
        super().__init__()
        if not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be a whole number >= 1, got {every_n_steps!r}.")
        self.log_dir = log_dir
        self.every_n_steps = every_n_steps
        self.log_per_layer = log_per_layer
        self.history: dict[str, list] = {"step": []}
        self._step = 0
        self._summary: dict[str, float] = {}
        self._writer = None

    @property
    def _optimizer(self) -> AdaptiveLossScaleOptimizer:
        optimizer = getattr(self.model, "optimizer", None)
        return _mistakes.adaptive_optimizer(optimizer, AdaptiveLossScaleOptimizer, "ScaleMonitor")

    def on_train_begin(self, logs=None):
        optimizer = self._optimizer
        if not optimizer.estimate_underflow:
            optimizer.estimate_underflow = True
            if getattr(self.model, "train_function", None) is not None:
                self.model.make_train_function(force=True)  # trace again, with the estimate
        if self.log_dir is not None and self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)

    def on_train_batch_end(self, batch, logs=None):
        self._step += 1
        if self._step % self.every_n_steps == 0 or not self._summary:
            telemetry = self._optimizer.telemetry()
            self._summary = _whole_model(telemetry)
            if self._step % self.every_n_steps == 0:
                self._record(telemetry)
        if logs is not None:
            logs.update(self._summary)  # refreshed every `every_n_steps` batches

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            telemetry = self._optimizer.telemetry()
            logs.update(_whole_model(telemetry))
            if self.log_per_layer:
                logs.update(_per_layer(telemetry))

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.flush()

    def _record(self, telemetry):
        values = _per_layer(telemetry)
        self.history["step"].append(self._step)
        for key, value in values.items():
            self.history.setdefault(key, []).append(value)
        if self._writer is not None:
            values["skipped_steps"] = telemetry["skipped_steps"]
            with self._writer.as_default(step=self._step):
                for key, value in values.items():
                    _scalar(key, value)


def _scalar(tag: str, value: float) -> None:
    """Writes a scalar TensorBoard shows, without needing the tensorboard package.

    `tf.summary.scalar` is TensorBoard's own code and raises without that
    package, which TensorFlow no longer installs; `tf.summary.write` with the
    metadata TensorBoard's scalars plugin reads (built from the public
    `tf.compat.v1.SummaryMetadata` proto) writes the same event.
    """
    metadata = tf.compat.v1.SummaryMetadata(
        plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class="DATA_CLASS_SCALAR",
    )
    tf.summary.write(tag, tf.constant(value, tf.float32), metadata=metadata.SerializeToString())


def _whole_model(telemetry) -> dict[str, float]:
    scales = telemetry["scale"].values()
    return {
        "scale_min": min(scales),
        "scale_max": max(scales),
        "skipped_steps": telemetry["skipped_steps"],
        "recent_skip_rate": telemetry["recent_skip_rate"],
        "skipped_in_a_row": telemetry["skipped_in_a_row"],
        "scaling_stuck": float(telemetry["warning"] is not None),
        "layers_beyond_float16": float(len(telemetry["beyond_float16"])),
        "layers_needing_float32": float(len(telemetry["needs_float32"])),
    }


def _per_layer(telemetry) -> dict[str, float]:
    values = {}
    for name in telemetry["scale"]:
        values[f"scale/{name}"] = telemetry["scale"][name]
        values[f"underflow/{name}"] = telemetry["underflow_rate"][name]
        values[f"zeros/{name}"] = telemetry["zero_rate"][name]
        values[f"headroom/{name}"] = telemetry["headroom"][name]
        values[f"overflows/{name}"] = telemetry["overflows"][name]
        values[f"beyond_float16/{name}"] = float(name in telemetry["beyond_float16"])
        values[f"needs_float32/{name}"] = float(name in telemetry["needs_float32"])
    return values
