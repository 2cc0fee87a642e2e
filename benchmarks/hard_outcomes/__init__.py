"""Training outcomes on the fidelity benchmark's hard models.

The fidelity benchmark compares one batch's gradients; this one trains. Each
hard case of `benchmarks.harness.zoo` (vanishing gradients through 16 sigmoid layers,
a loss summed over a large batch, targets in the thousands, a small late loss)
is trained from the same initial weights on the same batches by every method,
and the outcome is the final training loss, evaluated in float32 on all of the
case's rows with the weights the method reached. The mechanism is checked at
the end too: the method's unscaled gradient of the first batch against the
float32 gradient at the same weights (underflow: the share of values non-zero
in float32 and zero in the method's; relative error), and its skipped steps.

The plan (`plan`), fixed before any number: methods `float32`, `mixed_no_scaling`
(mixed_float16, no loss scale), `keras_lso` (Keras's `LossScaleOptimizer`,
defaults) and `als_max_safe` (keras_als, its default policy); seeds 0-4 (each
seed draws the initial weights and the batch order); `STEPS` Adam steps times
the case's `train_steps` at the case's learning rate and batch, XLA. Paired
differences (keras_als minus Keras's, per seed) with their standard errors.

`python -m benchmarks.hard_outcomes [--quick]` (`command`) trains every method
(`training`), prints the table (`report`) and writes
benchmarks/results/hard_outcomes.json and .md.
"""
