"""Loads TensorFlow without its C++ start-up log lines; the examples import it first.

`TF_CPP_MIN_LOG_LEVEL=3` (set here unless already set) hides TensorFlow's own
C++ INFO and WARNING lines. It does not hide two lines that TensorFlow 2.21
prints twice while `import tensorflow` loads its shared libraries, before
absl's C++ logging is initialized:

    WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
    I0000 00:00:... cudart_stub.cc:31] Could not find cuda drivers on your machine, ...

No environment variable turns them off (TF_CPP_MIN_LOG_LEVEL, GLOG_minloglevel,
ABSL_MIN_LOG_LEVEL, CUDA_VISIBLE_DEVICES were tried). They are written by C++
straight to file descriptor 2, so `import_tensorflow` points descriptor 2 at a
temporary file during the import and afterwards writes back to stderr every
line that is not such a log line; if the import fails, everything.

TensorFlow 2.19 prints three more such lines at its first XLA compilation (the
XLA service and its device, "Compiled cluster using XLA!"), each once a
process. `import_tensorflow` compiles a one-op function while it captures, so
they are dropped with the others (about 0.2 s; newer TensorFlow prints nothing).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

# absl's "before InitializeLog" notice, and absl/TensorFlow C++ log lines
# ("I0000 00:00:1795447159.381983   10369 cudart_stub.cc:31] ...").
C_LOG_LINE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IWEF]\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] )"
)


def import_tensorflow() -> None:
    """Imports TensorFlow, dropping only the C++ log lines it prints meanwhile."""
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf

            tf.function(lambda x: x + 1, jit_compile=True)(tf.zeros(()))
        except BaseException:
            os.dup2(saved, 2)
            captured.seek(0)
            sys.stderr.write(captured.read().decode(errors="replace"))
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        lines = captured.read().decode(errors="replace").splitlines(keepends=True)
    sys.stderr.write("".join(line for line in lines if not C_LOG_LINE.match(line)))


import_tensorflow()
