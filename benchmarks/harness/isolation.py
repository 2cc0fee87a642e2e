"""Keeping runs apart: seeds, fresh sessions, worker and fresh processes, build order."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent import futures

import keras


def fresh_session() -> None:
    """Frees what Keras and TensorFlow keep of earlier models and traced steps.

    The suite builds hundreds of models and compiled steps in one process; a
    full run once died in TensorFlow's native code (a segfault) after about
    a hundred training runs without this.
    """
    keras.utils.clear_session(free_memory=True)


TASKS_PER_PROCESS = 20
"""Tasks (training runs, fidelity cases) a worker process does before a fresh one
takes over: in one process, a full suite died in TensorFlow's native code (a
segfault in the C++ exception unwinder) at the 98th training run, twice at the
same run, which alone and after fewer runs trains normally."""


def worker_pool(workers: int = 1) -> futures.ProcessPoolExecutor:
    """Worker processes, spawned (a fresh TensorFlow each) and renewed every
    `TASKS_PER_PROCESS` tasks; all they compiled is freed when they end.

    One worker by default: TensorFlow already uses both cores of the benchmark
    machine, and two workers side by side ran each training run twice as slowly.
    Submit one task at a time and wait for it: on Python 3.11, a pool holding
    queued tasks does not replace a worker that reached its task limit, and hangs.
    """
    spawn = multiprocessing.get_context("spawn")
    return futures.ProcessPoolExecutor(workers, spawn, max_tasks_per_child=TASKS_PER_PROCESS)


def in_fresh_process(function: Callable, *args):
    """`function(*args)` in a new process, which frees all it compiled when it ends
    (XLA keeps every executable it compiled for as long as its process lives)."""
    with worker_pool(1) as pool:
        return pool.submit(function, *args).result()


def in_build_order(methods: tuple, k: int) -> tuple:
    """`methods` in the order instance group `k` builds them: reversed every
    other group, so that no method is always built before the others (the
    first model a process compiles runs faster than later ones of the same
    configuration: `benchmarks.real_models.timing.discard_first_build`)."""
    return methods if k % 2 == 0 else tuple(reversed(methods))


def set_seed(seed: int) -> None:
    """Seeds Python, NumPy and TensorFlow through Keras."""
    keras.utils.set_random_seed(seed)
