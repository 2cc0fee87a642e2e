"""PNG plots: per-layer scales over training, per-layer underflow keras_als vs Keras LSO."""

from __future__ import annotations

import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.suite.convergence import Run  # noqa: E402
from benchmarks.suite.fidelity import Measurement  # noqa: E402


def scales(runs: list[Run], path: str) -> str:
    """Per-layer scale (log2) after every step, keras_als max_safe vs Keras LSO, per task."""
    traced = [r for r in runs if r.scales]
    tasks = sorted({r.task for r in traced})
    fig, axes = plt.subplots(1, max(1, len(tasks)), figsize=(6.5 * max(1, len(tasks)), 4.2))
    axes = [axes] if not hasattr(axes, "__len__") else list(axes)
    for ax, task in zip(axes, tasks):
        for run in (r for r in traced if r.task == task):
            for name, values in run.scales.items():
                logs = [math.log2(v) for v in values]
                if run.method == "keras_lso":
                    ax.plot(logs, "k--", linewidth=2, label="Keras LSO (global)")
                else:
                    ax.plot(logs, linewidth=1, label=f"{run.method}: {name}")
        ax.set_title(f"{task}: scale of each component (seed {traced[0].seed})")
        ax.set_xlabel("training step")
        ax.set_ylabel("log2(scale)")
        ax.legend(fontsize=6, ncol=2)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def underflow(measurements: list[Measurement], path: str, methods=("keras_lso", "als_max_safe")):
    """Per-layer (kernel) underflow rate, one panel per case, both phases."""
    cases = list(dict.fromkeys(m.case for m in measurements))
    columns = min(4, len(cases))
    rows = math.ceil(len(cases) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    styles = {"keras_lso": "tab:red", "als_max_safe": "tab:blue"}
    for ax, case in zip(axes.ravel(), cases):
        for m in measurements:
            if m.case != case or m.method not in methods:
                continue
            kernels = [(n, u) for n, _, u in m.layers if n.endswith(("kernel", "embeddings"))]
            ax.plot(
                range(len(kernels)),
                [u for _, u in kernels],
                marker="o" if m.phase == "trained" else "x",
                linestyle="-" if m.phase == "trained" else ":",
                color=styles.get(m.method, "gray"),
                label=f"{m.method} ({m.phase})",
            )
        ax.set_title(case, fontsize=9)
        ax.set_xlabel("layer (input side = 0)", fontsize=8)
        ax.set_ylabel("underflow rate", fontsize=8)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    for ax in axes.ravel()[len(cases) :]:
        ax.axis("off")
    fig.suptitle("Weight-gradient underflow per layer: keras_als (max_safe) vs Keras LSO")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save_all(runs: list[Run], measurements: list[Measurement], folder: str) -> list[str]:
    """Writes every plot into `folder`; returns the file names."""
    return [
        os.path.basename(scales(runs, os.path.join(folder, "scales.png"))),
        os.path.basename(underflow(measurements, os.path.join(folder, "underflow.png"))),
    ]
