"""MirroredStrategy over 2 logical CPU devices (run by tests/test_distributed.py).

Run alone: `python tests/distributed/mirrored.py [telemetry]`; exits non-zero on failure.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_als  # noqa: E402

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
DEVICES = ["/cpu:0", "/cpu:1"]
GLOBAL_BATCH = 32


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 10)).astype("float32")
    y = (x @ rng.normal(size=(10, 1))).astype("float32")
    return x, y


def make_model(weights=None):
    model = keras.Sequential(
        [
            keras.Input((10,)),
            keras.layers.Dense(32, activation="tanh"),
            keras.layers.Dense(32, activation="sigmoid"),
            keras.layers.Dense(1, dtype="float32"),
        ]
    )
    if weights is not None:
        model.set_weights(weights)
    return keras_als.wrap_model(model)


def replicas_agree(variables):
    for v in variables:
        copies = [np.asarray(c) for c in v.value.values]
        for c in copies[1:]:
            np.testing.assert_array_equal(c, copies[0], err_msg=v.path)


def fit(strategy, weights, policy):
    keras.config.set_dtype_policy(policy)
    with strategy.scope():
        model = make_model(weights)
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.05))
        model.compile(optimizer=optimizer, loss="mse")
    x, y = data()
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=2, shuffle=False, verbose=0)
    return model, optimizer


def check_fit_matches_one_device():
    keras.utils.set_random_seed(1)
    weights = make_model().get_weights()
    for policy, tolerance in [("float32", 1e-5), ("mixed_float16", 2e-3)]:
        mirrored, optimizer = fit(tf.distribute.MirroredStrategy(DEVICES), weights, policy)
        replicas_agree(mirrored.weights)
        replicas_agree(optimizer.variables)
        single, single_optimizer = fit(tf.distribute.OneDeviceStrategy("/cpu:0"), weights, policy)
        worst = max(
            np.max(np.abs(a - b)) / np.max(np.abs(b))
            for a, b in zip(mirrored.get_weights(), single.get_weights(), strict=True)
        )
        assert worst <= tolerance, (policy, worst)
        assert int(optimizer.skipped_steps.numpy()) == 0
        print(f"fit {policy}: 2 replicas vs 1 device, largest relative difference {worst:.2e}")
        print(f"  scales (2 replicas): {optimizer.layer_scales()}")
        print(f"  scales (1 device):   {single_optimizer.layer_scales()}")


def check_one_bad_replica_makes_every_replica_skip():
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(2)
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        model = make_model()
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
        optimizer.build(model.trainable_variables)
    x, y = data()

    @tf.function
    def step(xb, yb):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                prediction = model(xb, training=True)
                per_example = tf.reduce_mean(tf.square(prediction - yb), axis=-1)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        strategy.run(replica_step, args=(xb, yb))

    def per_replica(xb, yb, poison_second):
        def value(context):
            half = GLOBAL_BATCH // 2
            i = context.replica_id_in_sync_group
            part = xb[i * half : (i + 1) * half]
            if poison_second and i == 1:
                part = np.full_like(part, np.nan)
            return tf.constant(part), tf.constant(yb[i * half : (i + 1) * half])

        values = strategy.experimental_distribute_values_from_function(value)
        return values

    batches = [(x[i : i + GLOBAL_BATCH], y[i : i + GLOBAL_BATCH]) for i in range(0, 256, 32)]
    for xb, yb in batches[:3]:
        step(*per_replica(xb, yb, poison_second=False))
    before = [w.copy() for w in model.get_weights()]
    slots = [np.asarray(v.value.values[0]).copy() for v in optimizer.inner_optimizer.variables]
    step(*per_replica(*batches[3], poison_second=True))
    replicas_agree(model.weights)
    replicas_agree(optimizer.variables)
    for a, b in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(a, b)
    for v, s in zip(optimizer.inner_optimizer.variables, slots, strict=True):
        np.testing.assert_array_equal(np.asarray(v.value.values[0]), s)
    assert int(optimizer.skipped_steps.numpy()) == 1
    for xb, yb in batches[4:]:
        step(*per_replica(xb, yb, poison_second=False))
    replicas_agree(model.weights)
    replicas_agree(optimizer.variables)
    assert int(optimizer.skipped_steps.numpy()) == 1
    assert int(optimizer.iterations.numpy()) == len(batches) - 1
    print("custom loop, NaN on replica 1 only: both replicas skipped that step, then trained on")


def check_underflow_telemetry_is_the_same_on_every_replica():
    """Each replica counts the zeros in its own gradients; what it writes must
    still be what the other replica writes. Replica 0 gets positive inputs,
    replica 1 negative ones, so every ReLU unit (all weights one) is alive on
    replica 0 and dead on replica 1: their gradients' zeros differ."""
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(3)
    strategy = tf.distribute.MirroredStrategy(DEVICES)
    with strategy.scope():
        model = keras_als.wrap_model(
            keras.Sequential(
                [
                    keras.Input((10,)),
                    keras.layers.Dense(32, activation="relu", kernel_initializer="ones"),
                    keras.layers.Dense(1, dtype="float32"),
                ]
            )
        )
        optimizer = keras_als.AdaptiveLossScaleOptimizer(
            keras.optimizers.SGD(1e-3), estimate_underflow=True
        )
        model.compile(optimizer=optimizer, loss="mse")
    x, y = data()
    half = GLOBAL_BATCH // 2
    sign = np.where(np.arange(len(x)) % GLOBAL_BATCH < half, 1.0, -1.0)[:, None]
    x = (sign * (np.abs(x) + 0.1)).astype("float32")
    model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
    replicas_agree(optimizer.variables)
    zero_rates = optimizer.telemetry(warn=False)["zero_rate"]
    assert 0 < max(zero_rates.values()) < 1, zero_rates
    print(f"telemetry with 2 replicas, zero rates {zero_rates}: the same on both")


if __name__ == "__main__":
    # Strategies made one after another in a process share TensorFlow's
    # collective keys: a second model whose gathered statistics differ in shape
    # would meet the first's collectives. The telemetry check has its own process.
    if sys.argv[1:] == ["telemetry"]:
        check_underflow_telemetry_is_the_same_on_every_replica()
    else:
        check_fit_matches_one_device()
        check_one_bad_replica_makes_every_replica_skip()
    print("mirrored: all checks passed")
