"""Layer-wise loss scales under tf.distribute.MirroredStrategy, on one CPU.

Splits the CPU into two logical devices, so that MirroredStrategy has two
replicas on any machine, then trains the same small classifier twice:

1. `model.fit`, with the model, the optimizer and `compile` under the
   strategy's scope;
2. a custom `strategy.run` step, with the optimizer built under the scope
   before the first distributed step, and the loss averaged over the global
   batch.

Every replica takes the same scaling decisions (the statistics are combined
over the replicas), so both end with one set of scales.

Run: `python examples/mirrored_strategy.py [--epochs N] [--smoke]`.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # before TensorFlow loads: no C++ INFO lines
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import argparse

import keras
import numpy as np
import tensorflow as tf

import keras_als

GLOBAL_BATCH = 64


def two_cpu_replicas() -> tf.distribute.MirroredStrategy:
    """MirroredStrategy over two logical CPU devices (set before TensorFlow
    initializes its devices, so before any other TensorFlow call)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def classifier() -> keras.Model:
    return keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((20,)),
                keras.layers.Dense(64, activation="relu", name="hidden"),
                keras.layers.Dense(10, dtype="float32", name="logits"),
            ]
        )
    )


def data(n: int = 1024, seed: int = 0):
    """Ten classes, each the index of the largest of the first ten features."""
    x = np.random.default_rng(seed).random((n, 20)).astype("float32")
    return x, x[:, :10].argmax(axis=1).astype("int32")


def with_fit(strategy, x, y, epochs: int) -> keras_als.AdaptiveLossScaleOptimizer:
    with strategy.scope():
        model = classifier()
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
        model.compile(
            optimizer=optimizer,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )
    history = model.fit(x, y, batch_size=GLOBAL_BATCH, epochs=epochs, verbose=0)
    print(f"   accuracy {history.history['accuracy'][-1]:.3f}")
    return optimizer


def with_custom_step(strategy, x, y, epochs: int) -> keras_als.AdaptiveLossScaleOptimizer:
    with strategy.scope():
        model = classifier()
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
        optimizer.build(model.trainable_variables)  # before the distributed step
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def train_step(batch):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x, training=True))
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL_BATCH)
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=batch), axis=None)

    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH)
    for _ in range(epochs):
        for batch in strategy.experimental_distribute_dataset(dataset):
            loss = train_step(batch)
    print(f"   loss {float(loss):.4f}")
    return optimizer


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="1 epoch (a quick check)")
    args = parser.parse_args(argv)
    epochs = 1 if args.smoke else args.epochs
    strategy = two_cpu_replicas()
    keras.config.set_dtype_policy("mixed_float16")
    x, y = data()
    print(f"replicas: {strategy.num_replicas_in_sync}")
    runs = [("1. model.fit", with_fit), ("2. custom strategy.run step", with_custom_step)]
    for title, train in runs:
        print(title)
        optimizer = train(strategy, x, y, epochs)
        print(f"   skipped steps: {int(optimizer.skipped_steps.numpy())}")
        print(f"   scales: {optimizer.layer_scales()}")


if __name__ == "__main__":
    main()
