"""The machine and the keras_als code a result was measured on."""

from __future__ import annotations

import datetime
import json
import os
import platform
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf


def code() -> str:
    """The keras_als code measured: git commit, uncommitted files, hash of the sources."""
    import glob
    import hashlib
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else "unknown"

    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(root, "keras_als", "*.py"))):
        with open(path, "rb") as f:
            digest.update(f.read())
    dirty = ", ".join(
        line.strip() for line in git("status", "--porcelain", "--", "keras_als").splitlines()
    )
    return (
        f"commit {git('rev-parse', '--short', 'HEAD')}"
        + (f", uncommitted changes: {dirty}" if dirty else ", clean")
        + f"; sha256 of keras_als/*.py {digest.hexdigest()[:12]}"
    )


def environment() -> str:
    """The machine, Python and the library versions."""
    return (
        f"{platform.node()} ({platform.machine()}, {os.cpu_count()} CPUs, "
        f"{platform.platform()}); Python {platform.python_version()}, TensorFlow "
        f"{tf.__version__}, Keras {keras.__version__}, NumPy {np.__version__}"
    )


def save(out: str, command: str, results: dict, render: Callable[[dict], str]) -> dict:
    """Writes a run to `out`.json and its markdown, `render` of it, to `out`.md.

    The JSON holds how the run was made (`command`, the date in UTC, the
    keras_als code and the environment) followed by `results`; returns it.
    """
    saved = {
        "command": command,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "provenance": code(),
        "environment": environment(),
        **results,
    }
    with open(out + ".json", "w") as f:
        json.dump(saved, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(render(saved))
    return saved
