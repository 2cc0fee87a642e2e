"""A training process that can be killed with SIGKILL and resumed.

`python tests/persistence/killed_run.py {fit|loop} DIR [KILL_AT_STEP]` trains
under mixed_float16 (so that scales measured and changed by training are
part of what a resume must restore) and writes DIR/final.npz at the end. With
KILL_AT_STEP it kills itself (SIGKILL, no clean-up) after that many steps.
Run again without it, it resumes from DIR.

Each file holds the weights, the layer scales, the optimizer's iterations and
the position (epoch or step) of that moment: DIR/start.npz what training
starts from (after any restore), DIR/saved.npz what the last checkpoint
saved, DIR/final.npz the end.

- fit: `keras.callbacks.BackupAndRestore(DIR, save_freq="epoch")`; Keras 3.15
  restores the epoch, not the batch, so the interrupted epoch is replayed from
  the state saved at its start.
- loop: a custom loop with `tf.train.Checkpoint` every 3 steps, which records
  the step too.
"""

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_als  # noqa: E402

BATCH, EPOCHS = 16, 3


def setup():
    keras.config.set_dtype_policy("mixed_float16")
    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(96, 8)).astype("float32")
    y = np.tanh(x @ rng.normal(size=(8, 2))).astype("float32")
    model = keras_als.wrap_model(
        keras.Sequential(
            [
                keras.Input((8,)),
                keras.layers.Dense(16, activation="sigmoid"),
                keras.layers.BatchNormalization(),
                keras.layers.Dense(16, activation="sigmoid"),
                keras.layers.Dense(2, dtype="float32"),
            ]
        )
    )
    optimizer = keras_als.AdaptiveLossScaleOptimizer(keras.optimizers.Adam(1e-2))
    return model, optimizer, x, y


def write(folder, name, model, optimizer, position):
    scales = optimizer.layer_scales()
    np.savez(
        os.path.join(folder, f"{name}.npz"),
        *model.get_weights(),
        scales=np.array([scales[k] for k in sorted(scales)]),
        iterations=int(optimizer.iterations.numpy()),
        position=position,
    )


class Record(keras.callbacks.Callback):
    """Writes start.npz at the first epoch `fit` runs (after BackupAndRestore,
    listed before it, restored) and saved.npz when an epoch ends (after
    BackupAndRestore saved it)."""

    def __init__(self, folder):
        super().__init__()
        self.folder, self.started = folder, False

    def on_epoch_begin(self, epoch, logs=None):
        if not self.started:
            self.started = True
            write(self.folder, "start", self.model, self.model.optimizer, epoch)

    def on_epoch_end(self, epoch, logs=None):
        write(self.folder, "saved", self.model, self.model.optimizer, epoch + 1)


def kill_after(steps):
    class Kill(keras.callbacks.Callback):
        seen = 0

        def on_train_batch_end(self, batch, logs=None):
            Kill.seen += 1
            if Kill.seen == steps:
                os.kill(os.getpid(), signal.SIGKILL)

    return Kill()


def run_fit(folder, kill_at):
    model, optimizer, x, y = setup()
    model.compile(optimizer=optimizer, loss="mse")
    backup = os.path.join(folder, "backup")  # removed by Keras when training ends
    callbacks = [keras.callbacks.BackupAndRestore(backup, save_freq="epoch"), Record(folder)]
    if kill_at:
        callbacks.append(kill_after(kill_at))
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks)
    return model, optimizer


def run_loop(folder, kill_at):
    model, optimizer, x, y = setup()
    optimizer.build(model.trainable_variables)
    step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    manager = tf.train.CheckpointManager(checkpoint, folder, max_to_keep=2)
    if manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_existing_objects_matched()
    write(folder, "start", model, optimizer, int(step.numpy()))

    @tf.function(jit_compile=True)
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb, training=True) - yb))
            scaled = optimizer.scale_loss(loss)
        optimizer.apply(tape.gradient(scaled, model.trainable_variables), model.trainable_variables)

    batches = [(x[i : i + BATCH], y[i : i + BATCH]) for i in range(0, len(x), BATCH)]
    total = EPOCHS * len(batches)
    while int(step.numpy()) < total:
        xb, yb = batches[int(step.numpy()) % len(batches)]
        train_step(xb, yb)
        step.assign_add(1)
        if int(step.numpy()) % 3 == 0:
            manager.save()
            write(folder, "saved", model, optimizer, int(step.numpy()))
        if kill_at and int(step.numpy()) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
    return model, optimizer


if __name__ == "__main__":
    mode, folder = sys.argv[1], sys.argv[2]
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    model, optimizer = (run_fit if mode == "fit" else run_loop)(folder, kill_at)
    write(folder, "final", model, optimizer, -1)
    print("scales", optimizer.layer_scales())
