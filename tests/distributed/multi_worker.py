"""MultiWorkerMirroredStrategy: 2 worker processes on 127.0.0.1 against 1 process.

`python tests/distributed/multi_worker.py` starts both workers (TF_CONFIG on
loopback ports) and a single-process run of the same training, then compares
the final weights; exits non-zero on failure. Run by tests/test_distributed.py.
"""

import json
import os
import socket
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
GLOBAL_BATCH = 32
TOLERANCE = 2e-3  # float16 rounding: the two runs sum the batch in different orders


def train(strategy, out):
    """A custom distributed loop (strategy.run), the same for 1 and 2 workers.

    Keras 3.15's model.fit fails under MultiWorkerMirroredStrategy before any
    step (its symbolic build reduces a distributed batch; without keras_als
    too), so this is the loop multi-worker users write.
    """
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_als

    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(1)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 10)).astype("float32")
    y = (x @ rng.normal(size=(10, 1))).astype("float32")
    with strategy.scope():
        model = keras_als.wrap_model(
            keras.Sequential(
                [
                    keras.Input((10,)),
                    keras.layers.Dense(32, activation="tanh"),
                    keras.layers.Dense(32, activation="sigmoid"),
                    keras.layers.Dense(1, dtype="float32"),
                ]
            )
        )
        optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.SGD(0.05))
        optimizer.build(model.trainable_variables)

    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH).with_options(options)
    distributed = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def step(batch):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                error = tf.reduce_mean(tf.square(model(xb, training=True) - yb), axis=-1)
                loss = tf.nn.compute_average_loss(error, global_batch_size=GLOBAL_BATCH)
                scaled = optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)

        strategy.run(replica_step, args=batch)

    for _ in range(2):
        for batch in distributed:
            step(batch)
    if out:
        np.savez(
            out,
            *model.get_weights(),
            skipped=int(optimizer.skipped_steps.numpy()),
            steps=int(optimizer.iterations.numpy()),
            scales=json.dumps(optimizer.layer_scales()),
        )


def free_ports(n):
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def launch(folder):
    import numpy as np

    workers = [f"127.0.0.1:{port}" for port in free_ports(2)]
    processes = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = dict(os.environ, TF_CONFIG=json.dumps(config))
        out = os.path.join(folder, "workers.npz") if index == 0 else ""
        processes.append(subprocess.Popen([sys.executable, __file__, "worker", out], env=env))
    single = subprocess.run(
        [sys.executable, __file__, "single", os.path.join(folder, "single.npz")]
    )
    codes = [p.wait(timeout=600) for p in processes]
    assert codes == [0, 0] and single.returncode == 0, (codes, single.returncode)
    ours = np.load(os.path.join(folder, "workers.npz"))
    reference = np.load(os.path.join(folder, "single.npz"))
    names = [k for k in reference.files if k.startswith("arr_")]
    worst = max(
        np.max(np.abs(ours[k] - reference[k])) / np.max(np.abs(reference[k])) for k in names
    )
    print(f"2 workers vs 1 process: largest relative weight difference {worst:.2e}")
    print(f"scales, 2 workers: {ours['scales']}; 1 process: {reference['scales']}")
    assert int(ours["skipped"]) == 0
    assert int(ours["steps"]) == int(reference["steps"]) == 16
    assert worst <= TOLERANCE, worst
    print("multi_worker: all checks passed")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        import tensorflow as tf

        train(tf.distribute.MultiWorkerMirroredStrategy(), sys.argv[2])
    elif len(sys.argv) > 1 and sys.argv[1] == "single":
        import tensorflow as tf

        train(tf.distribute.get_strategy(), sys.argv[2])
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            launch(folder)
