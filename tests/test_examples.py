"""The examples in examples/ run offline with --smoke and report what they did.

They print results, not logs: in a fresh environment (no TF_CPP_MIN_LOG_LEVEL)
neither stdout nor stderr holds a line of TensorFlow's C++ logging.
"""

from __future__ import annotations

import importlib.metadata
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
    # The attention's projections each have a scale of their own.
    for layer in ["loss", "embed", "query", "key", "value", "attention_output", "norm1", "logits"]:
        assert f"  {layer} " in out, layer


# Any line of absl's or TensorFlow's C++ logging, and the CPU-feature notice.
C_LOG = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog"
    r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\]"
    r"|To enable the following instructions)",
    flags=re.M,
)


def fresh_run(*command: str, **env: str) -> subprocess.CompletedProcess:
    """Runs Python with `command` in a fresh environment: PATH, HOME, PYTHONPATH and `env`."""
    env = dict(env, PATH=os.environ["PATH"], HOME=os.environ.get("HOME", "/"), PYTHONPATH=str(ROOT))
    return subprocess.run(
        [sys.executable, *command], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_tensorflow_prints_c_log_lines_that_the_examples_recognize_and_drop():
    """`import tensorflow` prints C++ log lines even with TF_CPP_MIN_LOG_LEVEL=3.

    That bare import is the reference: examples/_quiet.py recognizes every line of it.
    """
    bare = fresh_run("-c", "import tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    assert bare.returncode == 0, bare.stderr[-3000:]
    if not C_LOG.search(bare.stderr):
        pytest.skip(
            f"TensorFlow {importlib.metadata.version('tensorflow')} prints no C++ log line at "
            "import (2.20 does not; 2.19 and 2.21 do): nothing for the examples to drop"
        )
    sys.path.insert(0, str(EXAMPLES))
    try:
        import _quiet
    finally:
        sys.path.remove(str(EXAMPLES))
    assert [line for line in bare.stderr.splitlines() if not _quiet.C_LOG_LINE.match(line)] == []


def test_an_example_in_a_fresh_environment_prints_no_tensorflow_log_line():
    result = fresh_run(str(EXAMPLES / "custom_loop_xla.py"), "--smoke")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "held-out accuracy:" in result.stdout
    assert not C_LOG.search(result.stdout + result.stderr), result.stderr[-3000:]
    assert result.stderr == ""


@pytest.mark.slow
def test_the_demo_in_a_fresh_environment_runs_every_method_and_prints_results(tmp_path):
    """`examples/demo.py --smoke` in a fresh environment: a few steps of each part."""
    plot = tmp_path / "demo.png"
    result = fresh_run(str(EXAMPLES / "demo.py"), "--smoke", "--plot", str(plot))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert not C_LOG.search(result.stdout + result.stderr), result.stderr[-3000:]
    assert result.stderr == ""
    out = result.stdout
    # Part 1's three methods, then part 2's five, each a row of its part's table.
    part1, part2 = out.split("=== Part 2")
    row = r"^{} +(\d+\.\d+|not finite) +\d\.\d+ +(\d+) +-$"
    for method in [
        "float32",
        "mixed_float16 + Keras LossScaleOptimizer",
        "mixed_float16 + keras_als",
    ]:
        assert re.search(row.format(re.escape(method)), part1, re.M), method
    rows = {}
    for method in [
        "float32",
        "mixed_float16, no loss scaling",
        "mixed_float16 + Keras LossScaleOptimizer",
        "mixed_float16 + keras_als",
        "mixed_float16 + keras_als + Float32Fallback",
    ]:
        found = re.search(row.format(re.escape(method)), part2, re.M)
        assert found, method
        rows[method] = found.groups()
    assert "KerasHub SegFormer" in part2 and "Why one scale is hard here" in part2
    # Without loss scaling the SegFormer's float16 gradients overflow at once.
    assert rows["mixed_float16, no loss scaling"][0] == "not finite"
    assert rows["mixed_float16 + keras_als + Float32Fallback"][1] == "0"
    assert re.search(r"^Keras's one scale at the end: 2\^-?\d+; keras_als's \d+ scales", out, re.M)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"loss curves saved to {plot}" in out
