"""`plot_scales`: per-layer scales over steps and an underflow heatmap."""

from __future__ import annotations

import os

import numpy as np


def plot_scales(source, path: str | os.PathLike | None = None):
    """Draws per-layer scales over training and a per-layer underflow heatmap.

    Args:
        source: A `keras_als.ScaleMonitor` (per step), a `keras.callbacks.History`
            from a fit with a `ScaleMonitor(log_per_layer=True)` (per epoch), or a
            TensorBoard `log_dir` a `ScaleMonitor` wrote.
        path: Where to save the figure as PNG, or None.

    The figure is made without pyplot, so the session's matplotlib backend (a
    notebook's inline one, say) stays as it is; a notebook shows the returned
    figure when it is a cell's last value.

    Returns:
        The `matplotlib.figure.Figure`.

    Raises:
        ImportError: matplotlib is not installed (`pip install "keras-als[plots]"`).

    Example:

    >>> import keras_als
    >>> monitor = keras_als.ScaleMonitor()
    >>> monitor.history = {"step": [1, 2], "scale/loss": [2.0**15, 2.0**14],
    ...                    "underflow/loss": [0.0, 0.01]}
    >>> len(keras_als.plot_scales(monitor).axes)
    3
    """
    figure = _new_figure()
    steps, scales, underflow = _series(source)
    top, bottom = figure.subplots(2, 1)
    for name, values in scales.items():
        top.plot(steps, np.log2(np.maximum(values, 2.0**-30)), label=name)
    top.set_ylabel("log2(scale)")
    top.set_title("Loss scale per layer")
    top.legend(fontsize="small", ncol=3)
    names = list(underflow)
    grid = np.array([underflow[n] for n in names]) if names else np.zeros((1, len(steps)))
    image = bottom.imshow(grid, aspect="auto", cmap="magma", interpolation="nearest", vmin=0)
    bottom.set_yticks(range(len(names)), names, fontsize="small")
    ticks = np.linspace(0, len(steps) - 1, min(len(steps), 8)).astype(int) if steps else []
    bottom.set_xticks(ticks, [steps[i] for i in ticks])
    bottom.set_xlabel("step")
    bottom.set_title("Estimated underflow rate per layer")
    figure.colorbar(image, ax=bottom)
    if path is not None:
        figure.savefig(path, dpi=100)
    return figure


def _new_figure():
    """A 9x7 inch figure outside pyplot: the session's backend stays as the user set it."""
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError(
            "keras_als.plot_scales needs matplotlib, which is not installed: "
            'pip install "keras-als[plots]" (or pip install matplotlib).'
        ) from error
    return Figure(figsize=(9, 7), layout="constrained")


def _series(source):
    """(steps, {layer: scales}, {layer: underflow rates}) from any supported source."""
    if isinstance(source, (str, os.PathLike)):
        history = _read_log_dir(source)
    elif hasattr(source, "history") and isinstance(source.history, dict):
        history = dict(source.history)
        if "step" not in history:  # keras History: one value per epoch
            length = max((len(v) for v in history.values()), default=0)
            history["step"] = list(range(1, length + 1))
    else:
        raise TypeError(
            "plot_scales takes a ScaleMonitor, a keras History from a fit with a "
            f"ScaleMonitor, or a TensorBoard log_dir; got {type(source).__name__}."
        )
    scales = {
        k.split("/", 1)[1]: np.asarray(v, float)
        for k, v in history.items()
        if k.startswith("scale/")
    }
    if not scales:
        raise ValueError(
            "No per-layer scales found: was a keras_als.ScaleMonitor used (with "
            "log_per_layer=True, for a History)?"
        )
    underflow = {
        k.split("/", 1)[1]: np.asarray(v, float)
        for k, v in history.items()
        if k.startswith("underflow/")
    }
    return list(history["step"]), scales, underflow


def _read_log_dir(log_dir) -> dict[str, list]:
    import tensorflow as tf

    by_step: dict[int, dict[str, float]] = {}
    for path in sorted(tf.io.gfile.glob(os.path.join(str(log_dir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                by_step.setdefault(event.step, {})[value.tag] = float(tf.make_ndarray(value.tensor))
    steps = sorted(by_step)
    keys = sorted({k for values in by_step.values() for k in values})
    history = {"step": steps}
    for key in keys:
        history[key] = [by_step[s].get(key, np.nan) for s in steps]
    return history
