"""`_join_bounds`: a join's crossing gradients are bounded, not read.

A boundary whose output side holds only joins, copies and ReLUs receives
there the sum of the gradients crossing the boundaries that side feeds, so
its largest magnitude is at most the sum of theirs. On a small DenseNet-like
net (two chained concatenations, an `Add` and a ReLU), the bounds equal that
sum of reads in closed form and are never below the values a read gives; a
side along one path, a side holding any other operation, and every side under
a policy that reads mean squares keep their reads.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_als
from keras_als import policies
from keras_als.step import _apply_phases, _join_bounds

SCALES = policies.Fixed(
    default=2.0**3, scales={"b2": 2.0**6, "p": 2.0**-2, "q": 2.0**9, "r": 2.0**-5, "c1": 2.0**1}
)
"""A scale per layer, so that every bound is summed across different scales."""


def _dense_net(passing: bool = True) -> keras.Model:
    """stem -> c1 -> cat1 -> b2 -> c2 -> cat2 -> p -> add(p, cat2) -> relu
    (tanh unless `passing`) -> q, r -> heads(q, r) -> head."""
    layers = keras.layers
    inputs = keras.Input((6, 6, 3))
    x0 = layers.Conv2D(4, 3, padding="same", name="stem")(inputs)
    y1 = layers.Conv2D(4, 3, padding="same", name="c1")(layers.Activation("tanh")(x0))
    x1 = layers.Concatenate(name="cat1")([x0, y1])
    y2 = layers.Conv2D(4, 1, name="c2")(layers.BatchNormalization(name="b2")(x1))
    x2 = layers.Concatenate(name="cat2")([x1, y2])
    added = layers.Add(name="add")([layers.Conv2D(12, 1, name="p")(x2), x2])
    out = layers.Activation("relu" if passing else "tanh")(added)
    pooled = [layers.GlobalAveragePooling2D()(layers.Conv2D(5, 1, name=name)(out)) for name in "qr"]
    heads = layers.Add(name="heads")(pooled)
    return keras.Model(inputs, layers.Dense(1, name="head")(heads))


def _true_largest(passing: bool, policy, bounded: bool, monkeypatch, model=None) -> dict:
    """Per layer, the largest true (unscaled) value its boundaries' crossing
    gradients read, or their bound, on the second step of a custom loop; and
    whether the value was a bound. The model is `_dense_net(passing)` unless
    `model` builds another."""
    if not bounded:
        monkeypatch.setattr(_join_bounds, "rows", lambda *_: {})
    keras.utils.set_random_seed(0)
    plain = model() if model else _dense_net(passing)
    wrapped = keras_als.wrap_model(plain)
    optimizer = keras_als.AdaptiveLossScaleOptimizer(
        keras.optimizers.SGD(0.0), policy=policy, measure_every_n_steps=1
    )
    optimizer.build(wrapped.trainable_variables)
    plans = []
    original = _apply_phases.run

    def run(state, plan, grads, variables):
        plans.append(plan)
        return original(state, plan, grads, variables)

    monkeypatch.setattr(_apply_phases, "run", run)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.normal(size=(2, *plain.input_shape[1:])).astype("float32"))
    y = tf.constant(rng.normal(size=(2, *plain.output_shape[1:])).astype("float32"))

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((wrapped(x, training=True) - y) ** 2)
            scaled = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(scaled, wrapped.trainable_variables))
        plan = plans[-1]
        found = {}
        for b in plan.boundaries():
            if id(b) not in plan.crossings.reduced:
                continue  # the stem's boundary at the model's input: no gradient
            reduced = plan.crossings.reduced[id(b)]
            true = reduced.amax / plan.scales[plan.sides[id(b)][1]]
            found.setdefault(b.owner.layer.name, []).append((true, reduced.mean_square is None))
        return found

    step()  # builds the scales
    found = step()
    return {
        name: (max(float(v) for v, _ in pairs), {bool(k) for _, k in pairs} == {True})
        for name, pairs in found.items()
    }


def test_a_joins_crossing_gradient_is_bounded_by_the_sum_of_the_reads_its_output_feeds(
    monkeypatch,
):
    got = _true_largest(True, SCALES, bounded=True, monkeypatch=monkeypatch)
    # `heads` feeds one boundary along one path: a slice of a read, read itself.
    assert {name for name, (_, bound) in got.items() if bound} == {"cat1", "cat2", "add"}
    value = {name: v for name, (v, _) in got.items()}
    # add -> relu -> q, r; cat2 feeds p and add; cat1 feeds b2 and cat2.
    assert value["add"] == pytest.approx(value["q"] + value["r"], rel=1e-6)
    assert value["cat2"] == pytest.approx(value["p"] + value["add"], rel=1e-6)
    assert value["cat1"] == pytest.approx(value["b2"] + value["cat2"], rel=1e-6)


def test_a_bound_is_never_below_what_a_read_gives(monkeypatch):
    bounds = _true_largest(True, SCALES, bounded=True, monkeypatch=monkeypatch)
    with monkeypatch.context() as patch:
        reads = _true_largest(True, SCALES, bounded=False, monkeypatch=patch)
    assert not any(bound for _, bound in reads.values())
    for name in ("cat1", "cat2", "add"):
        assert 0 < reads[name][0] <= bounds[name][0] * (1 + 1e-6), name
    for name in ("c1", "b2", "c2", "p", "q", "r", "heads", "head"):  # read either way, alike
        assert bounds[name][0] == pytest.approx(reads[name][0], rel=1e-6), name


def test_a_join_whose_output_meets_any_other_operation_is_read(monkeypatch):
    # add -> tanh: only the operations of `PASSING` are passed through.
    got = _true_largest(False, SCALES, True, monkeypatch)
    assert {name for name, (_, bound) in got.items() if bound} == {"cat1", "cat2"}
    value = {name: v for name, (v, _) in got.items()}
    assert value["cat2"] == pytest.approx(value["p"] + value["add"], rel=1e-6)


def test_under_a_policy_that_reads_mean_squares_every_join_is_read(monkeypatch):
    got = _true_largest(True, policies.ApproxRange(), True, monkeypatch)
    assert not any(bound for _, bound in got.values())


def test_a_chain_of_joins_longer_than_pythons_recursion_limit_expands_into_its_reads():
    reads = [object() for _ in range(3000)]
    joins = [object() for _ in range(3000)]
    fed = {
        id(j): {reads[k]: 1, **({joins[k + 1]: 1} if k + 1 < len(joins) else {})}
        for k, j in enumerate(joins)
    }
    fed[id(joins[-1])] = {reads[-1]: 2}  # the last join feeds one read along two paths
    rows = _join_bounds._expanded(joins + reads, lambda b: fed.get(id(b), {}))
    assert rows[id(joins[0])] == {**{r: 1 for r in reads[:-1]}, reads[-1]: 2}
    assert rows[id(joins[-2])] == {reads[-2]: 1, reads[-1]: 2}
    assert all(rows[id(r)] is None for r in reads)


def test_paths_through_a_bounded_join_multiply():
    read, inner, outer = object(), object(), object()
    fed = {id(outer): {inner: 3}, id(inner): {read: 2}}
    rows = _join_bounds._expanded([outer, inner, read], lambda b: fed.get(id(b), {}))
    assert rows[id(outer)] == {read: 6}


def _consumers(model: keras.Model) -> dict:
    """Per layer name, the number of layers that call it (from the model's config)."""
    layers = model.get_config()["layers"]
    counts = dict.fromkeys((layer["name"] for layer in layers), 0)

    def called(value) -> set:
        if isinstance(value, dict):
            history = value.get("config", {}).get("keras_history")
            return {history[0]} if history else set().union(*map(called, value.values()))
        if isinstance(value, (list, tuple)):
            return set().union(*map(called, value))
        return set()

    for layer in layers:
        for name in called(layer["inbound_nodes"]):
            counts[name] += 1
    return counts


def _densenet121() -> keras.Model:
    return keras.applications.DenseNet121(weights=None, input_shape=(32, 32, 3), classes=3)


@pytest.mark.slow
def test_densenet121s_concatenations_feeding_two_layers_are_bounded_and_never_below_a_read(
    monkeypatch,
):
    model = _densenet121()
    consumers = _consumers(model)
    summing = {
        layer.name
        for layer in model.layers
        if isinstance(layer, keras.layers.Concatenate) and consumers[layer.name] >= 2
    }
    assert len(summing) == 6 + 12 + 24 + 16 - 4  # all but each dense block's last
    bounds = _true_largest(True, SCALES, True, monkeypatch, model=_densenet121)
    assert {name for name, (_, bound) in bounds.items() if bound} == summing
    with monkeypatch.context() as patch:
        reads = _true_largest(True, SCALES, False, patch, model=_densenet121)
    assert reads.keys() == bounds.keys()
    for name, (read, _) in reads.items():
        if name in summing:
            assert 0 < read <= bounds[name][0] * (1 + 1e-6), name
        else:
            assert bounds[name][0] == pytest.approx(read, rel=1e-6), name
