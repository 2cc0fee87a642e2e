"""The examples in examples/ run offline with --smoke and report what they did."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"


def run(script: str, *args: str) -> str:
    """Runs `examples/<script> --smoke` in a fresh process; returns its stdout."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--smoke", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


@pytest.mark.slow
def test_mnist_compile_example_reports_scales_and_saves_the_plot(tmp_path):
    plot = tmp_path / "scales.png"
    out = run("mnist_compile.py", "--plot", str(plot))
    assert "held-out accuracy:" in out
    assert "skipped:" in out
    for layer in ["loss", "conv1", "norm1", "conv2", "hidden", "logits"]:
        assert f"\n{layer} " in out, layer
    assert plot.exists() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_custom_loop_xla_example_trains_with_layer_wise_scales():
    out = run("custom_loop_xla.py")
    assert "held-out accuracy:" in out
    applied, skipped = map(int, re.search(r"steps applied: (\d+), skipped: (\d+)", out).groups())
    assert applied + skipped == 8 and applied >= 6
    for layer in ["loss", "dense0", "dense1", "dense2", "logits"]:
        assert f"  {layer} " in out, layer


@pytest.mark.slow
def test_transformer_example_trains_an_encoder_with_layer_wise_scales():
    out = run("transformer_sequence.py")
    assert "held-out accuracy:" in out
    assert "skipped:" in out
    for layer in ["loss", "embed", "attention", "norm1", "ff1", "logits"]:
        assert f"  {layer} " in out, layer
