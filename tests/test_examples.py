"""The examples in examples/ run offline with --smoke and report what they did.

Each runs as a reader runs a copy: alone in an empty folder, with keras_als
importable and nothing else of this repository (no helper module beside it,
no `benchmarks` or `tests`). They print results, not logs: TensorFlow's C++
start-up lines aside, which `import tensorflow` prints whatever the settings
(the examples set `TF_CPP_MIN_LOG_LEVEL` before it), stderr stays empty.
examples/demo.py, which drops those lines too while it loads TensorFlow, is
held to an empty stderr.
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).parent.parent
EXAMPLES = ROOT / "examples"
# The examples a reader copies: every script but the demo (scripts/demo.sh runs it).
STANDALONE = sorted(p.name for p in EXAMPLES.glob("*.py") if p.name != "demo.py")


def alone(script: str, folder: pathlib.Path) -> tuple[pathlib.Path, dict]:
    """`examples/<script>` copied alone into `folder`, and an environment in which
    keras_als is importable (a link to it in a folder of its own) and nothing
    else of the repository is."""
    site = folder / "site"
    site.mkdir()
    (site / "keras_als").symlink_to(ROOT / "keras_als", target_is_directory=True)
    copy = folder / script
    shutil.copy(EXAMPLES / script, copy)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return copy, dict(env, PYTHONPATH=str(site), TF_CPP_MIN_LOG_LEVEL="3")


def run(script: str, *args: str) -> str:
    """Runs `examples/<script> --smoke`, copied alone into an empty folder, in a
    fresh process there; returns its stdout."""
    with tempfile.TemporaryDirectory() as folder:
        copy, env = alone(script, pathlib.Path(folder))
        result = subprocess.run(
            [sys.executable, str(copy), "--smoke", *args],
            env=env,
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=600,
        )
    print(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


def test_every_standalone_example_is_run_by_a_test_of_this_file():
    source = pathlib.Path(__file__).read_text()
    assert STANDALONE, "no example found"
    unrun = [name for name in STANDALONE if f'run("{name}"' not in source]
    assert unrun == [], f"examples no test runs: {unrun}"


@pytest.mark.parametrize("script", STANDALONE)
def test_an_example_imports_nothing_from_beside_it(script):
    text = (EXAMPLES / script).read_text()
    assert not re.search(r"^\s*(import|from) (_quiet|benchmarks|tests)\b", text, re.M), script
    # No TensorFlow work when the module is imported: it runs under __main__.
    assert 'if __name__ == "__main__":' in text, script


def test_the_copy_runs_alone_and_a_helper_import_would_fail(tmp_path):
    copy, env = alone("custom_loop_xla.py", tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["custom_loop_xla.py", "site"]
    probe = subprocess.run(
        [sys.executable, "-c", "import benchmarks"], env=env, cwd=tmp_path, capture_output=True
    )
    assert probe.returncode != 0


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


@pytest.mark.slow
def test_float32_tools_example_fixes_a_layer_float16_cannot_hold_in_fit_and_in_a_loop():
    out = run("float32_tools.py")
    without, fallback, loop = out.split("\n2. ")[0], *out.split("\n2. ")[1].split("\n3. ")
    assert "final loss nan" in without and "loss scaling looks stuck" in without
    assert "[(0, ['wide'])]" in fallback and "skipped steps: 0" in fallback
    assert "set to float32: ['wide']" in loop and "skipped steps: 0" in loop


@pytest.mark.slow
def test_mirrored_strategy_example_trains_on_two_replicas_with_fit_and_a_custom_step():
    out = run("mirrored_strategy.py")
    assert "replicas: 2" in out
    assert out.count("skipped steps:") == 2
    assert out.count("'hidden':") == 2 and out.count("'logits':") == 2


@pytest.mark.slow
def test_keras_hub_task_example_trains_a_gpt2_task_with_a_scale_per_projection():
    out = run("keras_hub_task.py")
    assert out.startswith("GPT2CausalLM")
    before, after = map(float, re.search(r"held-out loss: ([\d.]+) before, ([\d.]+)", out).groups())
    assert after < before
    for name in ["query", "key", "value", "attention_output"]:
        assert f"transformer_layer_0/self_attention/{name} " in out, name


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


def demo_log_line() -> re.Pattern:
    """The demo's `_LOG_LINE`: the log lines it drops while it loads TensorFlow."""
    import ast

    tree = ast.parse((EXAMPLES / "demo.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["_LOG_LINE"]:
            return re.compile(ast.literal_eval(node.value.args[0]))
    raise AssertionError("examples/demo.py has no _LOG_LINE")


def test_tensorflow_prints_c_log_lines_that_the_examples_recognize_and_drop():
    """`import tensorflow` prints C++ log lines even with TF_CPP_MIN_LOG_LEVEL=3.

    That bare import is the reference: the demo's pattern of such lines (read
    from its source, not imported) recognizes every line of it.
    """
    bare = fresh_run("-c", "import tensorflow", TF_CPP_MIN_LOG_LEVEL="3")
    assert bare.returncode == 0, bare.stderr[-3000:]
    if not C_LOG.search(bare.stderr):
        pytest.skip(
            f"TensorFlow {importlib.metadata.version('tensorflow')} prints no C++ log line at "
            "import (2.20 does not; 2.19 and 2.21 do): nothing for the examples to drop"
        )
    assert [line for line in bare.stderr.splitlines() if not demo_log_line().match(line)] == []


def test_an_example_in_a_fresh_environment_prints_results_and_no_warning(tmp_path):
    """No Python warning and no log line of TensorFlow's beyond those `import
    tensorflow` prints before any setting can apply (TensorFlow 2.21: absl's
    notice and the missing CUDA driver; the demo drops them)."""
    copy, env = alone("custom_loop_xla.py", tmp_path)
    env = dict(
        PATH=os.environ["PATH"], HOME=os.environ.get("HOME", "/"), PYTHONPATH=env["PYTHONPATH"]
    )
    result = subprocess.run(
        [sys.executable, str(copy), "--smoke"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "held-out accuracy:" in result.stdout
    assert not C_LOG.search(result.stdout), result.stdout[-3000:]
    assert [line for line in result.stderr.splitlines() if not C_LOG.match(line)] == []


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
