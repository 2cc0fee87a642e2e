"""What a compiled step and its process hold in memory, read on the CPU.

TensorFlow keeps no allocator statistics for the CPU, so a study reads XLA's
buffer assignment of the compiled step (dumped with
`XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text`) and the process's peak
resident set from /proc. The suite's memory study (`benchmarks.suite.memory`)
and the real models' (`benchmarks.real_models`) both read them so.
"""

from __future__ import annotations

import glob
import os
import re


def dump_flags(dump: str, name: str | None = None) -> str:
    """`XLA_FLAGS` that dump the optimized programs and buffer assignments of
    the modules named like `name` (every module if None) into `dump`, as text."""
    flags = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"
    return flags if name is None else f"{flags} --xla_dump_hlo_module_re=.*{name}.*"


def xla_total(dump: str, name: str = "train_step") -> int:
    """The largest "Total bytes used" of XLA modules named like `name` in `dump`."""
    return largest_buffer_assignment(buffer_assignments(dump, name), name)[0]


def xla_peak(dump: str, name: str = "train_step") -> int:
    """XLA's "peak usage" (bytes live at once) of the module `xla_total` reads."""
    return peak_of(buffer_assignments(dump, name), name)


def buffer_assignments(dump: str, name: str) -> list[str]:
    """The buffer-assignment files XLA dumped into `dump` for modules named like `name`."""
    return glob.glob(os.path.join(dump, f"*{name}*buffer-assignment.txt"))


def peak_of(paths: list[str], name: str = "train_step") -> int:
    """XLA's "peak usage" of the module with the largest total among the buffer
    assignments at `paths` (`buffer_assignments`; `name` only names it in errors)."""
    return peak_in(largest_buffer_assignment(paths, name)[1], name)


def peak_in(text: str, name: str = "train_step") -> int:
    """XLA's "peak usage" stated in one buffer-assignment text."""
    found = re.search(r"peak usage: ([\d ]+) bytes", text)
    if not found:
        raise RuntimeError(f"XLA's buffer assignment for {name} states no peak usage")
    return int(found.group(1).replace(" ", ""))


def largest_buffer_assignment(paths: list[str], name: str) -> tuple[int, str, str]:
    """(total bytes, text, path) of the buffer assignment at `paths` with the
    largest total."""
    found = []
    for path in paths:
        with open(path) as f:
            text = f.read()
        total = re.search(r"Total bytes used: (\d+)", text)
        if total:
            found.append((int(total.group(1)), text, path))
    if not found:
        raise RuntimeError(f"XLA wrote no buffer assignment for {name}")
    return max(found, key=lambda found: found[0])


def high_water_mb() -> float:
    """This process's peak resident set (VmHWM), MiB.

    Not `resource.getrusage().ru_maxrss`: Linux keeps that across `exec`, so a
    child started from a large parent reports the parent's peak.
    """
    with open("/proc/self/status") as f:
        found = re.search(r"VmHWM:\s+(\d+) kB", f.read())
    return int(found.group(1)) / 1024.0 if found else float("nan")
