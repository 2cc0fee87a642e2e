"""Two losses far apart: where one global loss scale starts to lose, and keras_als does not.

    python -m benchmarks.loss_span          # the plan below, ~20 min on 2 cores (72 runs)
    python -m benchmarks.loss_span --quick  # 1 seed, 3 exponents (checks that it works)

The mechanism (issue 13): when one loss's gradients are far larger than
another's, the largest caps Keras's one dynamic scale, and at that scale the
other loss's gradients fall into float16's subnormal range or flush to zero.
keras_als gives every wrapped layer its own scale, so each branch keeps one
that suits it.

The task, fixed before any number was measured: scikit-learn's 8x8 digits
(1,200 training, 597 held-out images, a fixed permutation), a model with two
heads on the same input, under mixed_float16:

- `value`: Dense(64, relu) and a float32 Dense(1), MSE against a smooth random
  teacher of the pixels times `10**exponent` (the knob: how far the two
  losses' gradients lie apart);
- `digit`: four Dense(64, relu) and float32 logits, sparse categorical
  cross-entropy against the digit's class.

The two branches share no weight, so in float32 the digit branch trains the
same whatever the exponent; its held-out accuracy is the outcome. The loss is
the sum of the two; Adam 1e-3 (per-parameter normalisation keeps the value
branch stable at any target magnitude); batch 64; 16 epochs of 18 batches
(288 steps); `model.fit(jit_compile=True)`; the same initial weights and row
order for every method of a seed. Exponents `EXPONENTS`, seeds `SEEDS`.

Methods: `float32`; `mixed_no_scaling` (mixed_float16, `auto_scale_loss=False`);
`keras_lso` (Keras's `LossScaleOptimizer`, defaults); `keras_als`
(`wrap_model` + `AdaptiveLossScaleOptimizer(Adam)`, defaults).

The mechanism is checked, not assumed: after training, on a fixed batch, each
mixed-precision run computes the digit branch's weight gradients at the scale
its optimizer ended with for that branch (Keras: its one scale; keras_als: the
scale of each layer; no scaling: 1), and counts the share of them that are
exactly zero though they are not at a scale where nothing underflows
(`2**12` on the digit loss alone): `flushed`.

Writes `benchmarks/results/loss_span.json`, `.md` and `.png` (`--quick`: into
`benchmarks/results/quick/`).

Per-loss scales (`--float16-heads`, ~8 min): the same task at `10**12` with
the digit head's last Dense in float16 (the value head's stays float32: its
outputs reach 10^12, beyond float16's range), where that layer's weights share
the scale of the loss unless each output gets its own. Methods
as above plus `keras_als_per_output` (`wrap_model(scale_each_output=True)`);
3 seeds. Writes `loss_span_float16_heads.json` and `.md`.

Modules: `training` (task, model, one run), `report` (tables and plot),
`command` (the command line).
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
