"""What the studies share (benchmarks/harness): ablations, worker processes,
build order and the memory readers."""

import importlib.util
import os

import pytest


def test_the_memory_and_step_time_ablations_leave_the_crossing_reductions_out_and_back():
    import tensorflow as tf

    from benchmarks.harness import ablations
    from benchmarks.suite import cost
    from keras_als.step import _crossings

    boundary = object()

    def reductions():
        graph = tf.Graph()
        with graph.as_default():
            gradient = tf.constant([[-3.0, 2.0]])
            crossings = _crossings.Crossings(graph, None, False)
            crossings.arrived(boundary, [gradient])
            crossings.finish()
            return {b: tf.compat.v1.Session().run(r.amax) for b, r in crossings.reduced.items()}

    assert reductions() == {id(boundary): 3.0}
    with ablations.named("no_crossing_reductions"):
        assert reductions() == {}
    assert reductions() == {id(boundary): 3.0}
    with ablations.named(""):
        assert reductions() == {id(boundary): 3.0}
    with pytest.raises(ValueError, match="no_crossing_reductions"):
        ablations.named("no_such_thing")
    with cost._traced_for("als_no_crossing_reductions"):
        assert reductions() == {}
    with cost._traced_for("als_max_safe"):
        assert reductions() == {id(boundary): 3.0}
    assert reductions() == {id(boundary): 3.0}


def test_the_concatenation_ablation_leaves_out_only_the_gradients_crossing_into_a_join():
    import keras
    import tensorflow as tf

    from benchmarks.harness import ablations
    from keras_als.step import _crossings

    class Owner:  # a hook: the boundaries' owner holds its layer
        def __init__(self, layer):
            self.layer = layer

    join = Owner(keras.layers.Concatenate())
    dense = Owner(keras.layers.Dense(2))

    def reduced():
        graph = tf.Graph()
        with graph.as_default():
            crossings = _crossings.Crossings(graph, None, False)
            for owner in (join, dense):
                boundary = type("Boundary", (), {"owner": owner})()
                crossings.arrived(boundary, [tf.constant([[-3.0, 2.0]])])
            crossings.finish()
            return len(crossings.reduced)

    assert reduced() == 2
    with ablations.named("no_concatenation_reductions"):
        assert reduced() == 1
    assert reduced() == 2


def test_the_rescaling_ablation_hands_the_crossing_gradient_on_as_it_arrived_and_only_inside():
    """`without_boundary_rescaling` (the step breakdown's `no_boundary_rescaling`)
    leaves a boundary's gradient as it arrives, for a boundary that divides (rank
    2) and one that multiplies (rank 4); on exit, the boundaries divide by 4 (or
    multiply by 1/4) again, exactly."""
    import keras
    import tensorflow as tf

    from benchmarks.harness import ablations
    from keras_als.step import _boundary

    owner = keras.layers.Dense(1)  # held weakly by the boundary
    arriving = [1.0, -6.0, 2.0**-20, 3.0]

    def crossed(rank):
        inputs = tf.zeros([1] * (rank - 1) + [4])
        boundary = _boundary.Boundary(owner, [inputs], float("inf"))
        boundary.connect(tf.constant(4.0 if boundary.divides else 0.25), None)
        (gradient,) = boundary.backward(tf.reshape(tf.constant(arriving), inputs.shape))
        return boundary.divides, tf.reshape(gradient, [-1]).numpy().tolist()

    quarter = [v / 4 for v in arriving]
    assert crossed(2) == (True, quarter) and crossed(4) == (False, quarter)
    with ablations.without_boundary_rescaling():
        assert crossed(2) == (True, arriving) and crossed(4) == (False, arriving)
    assert crossed(2) == (True, quarter) and crossed(4) == (False, quarter)


def test_the_scheduling_ablations_reduce_the_same_values_at_other_points(monkeypatch):
    """With every arrival a group of its own: keras_als reduces it on arrival
    and hands back an exact zero read from the branch; `crossings_never_wait`
    reduces it so and hands back nothing; `crossings_reduced_last` reduces
    nothing before `finish`. The step-time breakdown traces its variant
    `als_crossings_never_wait` inside that ablation."""
    import tensorflow as tf

    from benchmarks.harness import ablations
    from benchmarks.suite import cost
    from keras_als.step import _crossings

    monkeypatch.setattr(_crossings, "WAITING_BYTES", 1)
    boundary = object()

    def arrive():
        graph = tf.Graph()
        with graph.as_default():
            crossings = _crossings.Crossings(graph, tf.constant(True), False)
            zero = crossings.arrived(boundary, [tf.constant([[-3.0, 2.0]])])
            reduced_on_arrival = bool(crossings.reduced)
            crossings.finish()
            session = tf.compat.v1.Session()
            amax = {b: session.run(r.amax) for b, r in crossings.reduced.items()}
            return reduced_on_arrival, amax, None if zero is None else session.run(zero)

    assert arrive() == (True, {id(boundary): 3.0}, 0.0)
    with ablations.named("crossings_never_wait"):
        assert arrive() == (True, {id(boundary): 3.0}, None)
    with ablations.named("crossings_reduced_last"):
        assert arrive() == (False, {id(boundary): 3.0}, None)
    assert arrive() == (True, {id(boundary): 3.0}, 0.0)
    with cost._traced_for("als_crossings_never_wait"):
        assert arrive() == (True, {id(boundary): 3.0}, None)


def test_only_a_gradient_that_fills_a_group_alone_waits_for_its_reductions(monkeypatch):
    import tensorflow as tf

    from benchmarks.harness import ablations
    from keras_als.step import _crossings

    monkeypatch.setattr(_crossings, "WAITING_BYTES", 12)  # two 8-byte gradients fill a group

    def waits(sizes):
        """For each arrival of a float32 gradient of `sizes[i]` values, whether it waits."""
        graph = tf.Graph()
        with graph.as_default():
            crossings = _crossings.Crossings(graph, tf.constant(True), False)
            return [crossings.arrived(object(), [tf.ones([n])]) is not None for n in sizes]

    assert waits([2, 2, 4]) == [False, False, True]
    with ablations.named("crossings_reduced_early"):
        assert waits([2, 2, 4]) == [False, True, True]
    with ablations.named("crossings_never_wait"):
        assert waits([2, 2, 4]) == [False, False, False]


def test_gradients_that_wait_for_their_reductions_train_bit_identically(monkeypatch):
    """float32, XLA, 2 steps of a small wrapped MLP, each crossing gradient a
    group of its own, so each waits for its branch: the exact zero added to
    each ratio leaves every weight as it is when none waits."""
    import keras
    import numpy as np

    import keras_als
    from benchmarks.harness import ablations
    from keras_als.step import _crossings

    monkeypatch.setattr(_crossings, "WAITING_BYTES", 1)
    x = np.random.default_rng(0).normal(size=(16, 8)).astype("float32")
    y = x[:, :1] * 3.0
    weights = []
    for ablation in ("", "crossings_never_wait"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1)]
        )
        keras_als.wrap_model(model)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.Adam(1e-2), measure_every_n_steps=1
        )
        model.compile(optimizer, "mse", jit_compile=True)
        with ablations.named(ablation):
            for _ in range(2):
                model.train_on_batch(x, y)
        weights.append([keras.ops.convert_to_numpy(w) for w in model.weights])
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_worker_pool_renews_its_worker_and_does_not_hang(monkeypatch):
    import os

    from benchmarks.harness import isolation

    monkeypatch.setattr(isolation, "TASKS_PER_PROCESS", 2)
    with isolation.worker_pool() as pool:
        workers = [pool.submit(os.getpid).result(timeout=120) for _ in range(5)]
    assert len(set(workers)) == 3  # tasks 1-2, 3-4, 5


def test_instance_groups_alternate_which_method_is_built_first():
    from benchmarks.harness import isolation

    methods = ("keras", "keras_als", "wrapper_only")
    orders = [isolation.in_build_order(methods, k) for k in range(4)]
    assert orders == [methods, methods[::-1], methods, methods[::-1]]
    firsts = [order[0] for order in orders]
    assert firsts.count("keras") == firsts.count("wrapper_only") == 2


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("adaptive", [False, True])
def test_the_cost_comparisons_sides_wrap_in_place_and_keep_the_inner_optimizer(wrap, adaptive):
    """Every cost study builds its two sides through `scaling.loss_scaled`: the
    model itself, wrapped only if asked, and the inner optimizer under
    keras_als's optimizer or Keras's, at their defaults."""
    import keras

    import keras_als
    from benchmarks.harness import scaling

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    inner = keras.optimizers.SGD(0.1)
    built, optimizer = scaling.loss_scaled(model, inner, wrap=wrap, adaptive=adaptive)
    assert built is model
    assert (keras_als.instrument.hook_of(model.layers[0]) is not None) == wrap
    expected = (
        keras_als.AdaptiveLossScaleOptimizer if adaptive else keras.optimizers.LossScaleOptimizer
    )
    assert type(optimizer) is expected and optimizer.inner_optimizer is inner


def test_memory_reads_the_total_and_the_peak_of_the_largest_compiled_step(tmp_path):
    """XLA's buffer-assignment dumps, as it writes them (numbers from a real
    dump): the total and the peak usage both come from the module with the
    largest total, the peak's digits grouped by spaces."""
    from benchmarks.harness import xla_memory

    def dump(name, total, peak):
        path = tmp_path / f"module_{name}.train_step.cpu_after_optimizations-buffer-assignment.txt"
        path.write_text(
            f"BufferAssignment:\nTotal bytes used: {total} (3.08MiB)\n"
            f"  Stack trace breakdown for peak usage: {peak} bytes\n"
        )

    dump("0001", 3225614, "2 571 526")
    dump("0002", 1024, "1 000")  # a smaller compiled version of the step
    assert xla_memory.xla_total(str(tmp_path)) == 3225614
    assert xla_memory.xla_peak(str(tmp_path)) == 2571526


def test_the_code_hash_covers_the_sub_packages(tmp_path, monkeypatch):
    """A change in `keras_als/float32/` changes the recorded hash, as one in
    `keras_als/` does (the hash read every sub-package's sources)."""
    import shutil

    from benchmarks.harness import provenance

    root = tmp_path / "repo"
    (root / "benchmarks" / "harness").mkdir(parents=True)
    shutil.copytree(
        os.path.join(os.path.dirname(provenance.__file__), "..", "..", "keras_als"),
        root / "keras_als",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    copy = root / "benchmarks" / "harness" / "provenance.py"
    shutil.copy(provenance.__file__, copy)
    spec = importlib.util.spec_from_file_location("provenance_copy", copy)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    before = module.code().split("sha256 of keras_als/**/*.py ")[1]
    with open(root / "keras_als" / "float32" / "fallback.py", "a") as f:
        f.write("\n# changed\n")
    assert module.code().split("sha256 of keras_als/**/*.py ")[1] != before
