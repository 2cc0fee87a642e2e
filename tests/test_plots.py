"""plot_scales as a notebook meets it: the session's backend kept, a missing extra named."""

import sys

import matplotlib
import pytest

import keras_als


def _monitor():
    monitor = keras_als.ScaleMonitor()
    monitor.history = {
        "step": [1, 2, 3],
        "scale/loss": [2.0**15, 2.0**14, 2.0**14],
        "scale/dense": [2.0**16, 2.0**16, 2.0**15],
        "underflow/dense": [0.0, 0.01, 0.02],
    }
    return monitor


def test_plot_scales_leaves_the_session_s_matplotlib_backend_as_it_was(tmp_path):
    previous = matplotlib.get_backend()
    matplotlib.use("svg")  # a backend other than the Agg a PNG is drawn with
    try:
        figure = keras_als.plot_scales(_monitor(), tmp_path / "scales.png")
        assert matplotlib.get_backend() == "svg"
    finally:
        matplotlib.use(previous)
    assert len(figure.axes) == 3  # scales, heatmap, colour bar
    assert (tmp_path / "scales.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_plot_scales_names_the_extra_to_install(monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)  # None in sys.modules: import fails
    with pytest.raises(ImportError, match=r'pip install "keras-als\[plots\]"'):
        keras_als.plot_scales(_monitor())
