"""LoRA fine-tuning of a tiny Gemma causal LM on the standard library's docstrings.

The plan (fixed before the first number): per seed, `hub_tasks.gemma_causal_lm()`
is pretrained in float32 (`PRETRAIN_STEPS` steps of `PRETRAIN_BATCH` byte
windows of the docstrings of `hub_tasks.PRETRAINING_MODULES`, Adam 1e-3); then
`backbone.enable_lora(RANK)` freezes it but for the LoRA weights, and each
method fine-tunes that same model by `model.fit` with XLA on the docstrings of
other modules (`hub_tasks.FINE_TUNING_MODULES`: their first 90%), Adam at
`LEARNING_RATE` (Keras's default, not tuned), batch `BATCH`, `BLOCKS` blocks of
`STEPS_PER_BLOCK` steps. Methods (`training.METHODS`): float32, mixed_float16 with no
loss scaling, Keras's `LossScaleOptimizer`, keras_als (default policy); seeds
`SEEDS`.

The outcome is the cross-entropy per byte on `HELD_OUT` windows of the last 10%
of the fine-tuning text, every method's weights evaluated in a float32 copy of
the model (so the outcome is the training's, not float16 inference's).
"""

from __future__ import annotations

import keras
import numpy as np

from benchmarks.harness import hub_tasks, scaling
from benchmarks.keras_hub_tasks import training

SEEDS = (0, 1, 2, 3, 4)
PRETRAIN_STEPS = 2000
PRETRAIN_BATCH = 32
RANK = 4
BATCH = 16
STEPS_PER_BLOCK = 100
BLOCKS = 10
LEARNING_RATE = 1e-3
HELD_OUT = 512
QUICK = {"seeds": (0,), "blocks": 2, "steps_per_block": 20, "pretrain_steps": 50}
"""`--quick`: checks that the study runs; its numbers mean nothing."""
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def with_lora(model: keras.Model) -> keras.Model:
    """`model` with LoRA of rank `RANK` enabled on its backbone."""
    model.backbone.enable_lora(RANK)
    return model


def fine_tuning_text() -> tuple[bytes, bytes]:
    """The fine-tuning modules' docstrings: `(first 90%, last 10%)`."""
    text = hub_tasks.standard_library_text(hub_tasks.FINE_TUNING_MODULES)
    cut = len(text) * 9 // 10
    return text[:cut], text[cut:]


def pretrained_weights(seed: int, steps: int = PRETRAIN_STEPS) -> list[np.ndarray]:
    """The weights (LoRA ones included, as enabled after pretraining) of the
    model every method of `seed` fine-tunes."""
    keras.utils.set_random_seed(seed)
    with scaling.precision("float32"):
        model = hub_tasks.gemma_causal_lm()
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=LOSS, jit_compile=True)
        x, y = hub_tasks.text_batches(steps * PRETRAIN_BATCH, seed=seed)
        model.fit(x, y, batch_size=PRETRAIN_BATCH, epochs=1, shuffle=False, verbose=0)
        return with_lora(model).get_weights()


def run_seed(
    seed: int,
    blocks: int = BLOCKS,
    steps_per_block: int = STEPS_PER_BLOCK,
    pretrain_steps: int = PRETRAIN_STEPS,
):
    """Every method of the plan on one seed: `list[training.Run]`, and
    `{"pretrained_held_out_loss": ...}`, the pretrained model's held-out loss
    before fine-tuning."""
    keras.utils.clear_session()
    weights = pretrained_weights(seed, pretrain_steps)
    train_text, held_text = fine_tuning_text()
    size = steps_per_block * BATCH
    x, y = hub_tasks.text_batches(blocks * size, seed=seed, text=train_text)

    def block(b):
        rows = slice(b * size, (b + 1) * size)
        return {k: v[rows] for k, v in x.items()}, y[rows]

    def build():
        return with_lora(hub_tasks.gemma_causal_lm())

    arms = [
        training.arm(m, build, weights, keras.optimizers.Adam(LEARNING_RATE), loss=LOSS)
        for m in training.METHODS
    ]
    training.train(arms, block, blocks, BATCH)
    held_out = hub_tasks.text_batches(HELD_OUT, seed=1000 + seed, text=held_text)
    runs = [
        training.record(a, seed, held_out_loss(a.model.get_weights(), held_out), steps_per_block)
        for a in arms
    ]
    return runs, {"pretrained_held_out_loss": held_out_loss(weights, held_out)}


def held_out_loss(weights: list[np.ndarray], held_out: tuple) -> float:
    """Cross-entropy per byte of `weights` on `held_out`, in a float32 model."""
    if not training.finite(weights):
        return float("nan")
    with scaling.precision("float32"):
        model = with_lora(hub_tasks.gemma_causal_lm())
        model.set_weights(weights)
        model.compile(loss=LOSS)
        return float(model.evaluate(*held_out, batch_size=64, verbose=0, return_dict=True)["loss"])
