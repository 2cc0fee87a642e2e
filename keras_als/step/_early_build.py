"""The optimizer built in the first trace of its step without a second trace.

`model.fit` and `train_on_batch` leave the optimizer to be built by `apply`,
inside the first trace of the training step (Keras builds it beforehand
only under a distribution strategy). A variable made inside a trace makes
TensorFlow trace the whole step again, and keras_als could not keep the first
trace anyway: its plan, made by `scale_loss` before `apply`, had no scale
variables to read. A trace of keras_als's step on ViT-Base takes about 4 s.

So `scale_loss`, in a step traced before the optimizer is built, makes the
scale variables itself, eagerly and untracked, for the trainable variables
of the model the forward pass entered (`variables_to_build_for`): in `fit`,
the model being trained, whose `trainable_variables` are what `apply` will
be given. `apply` checks the guess (`made_for`). Given exactly those
variables, in that order, it adopts the scale variables and builds the rest
of the optimizer eagerly too: the first trace is the only one, and the
optimizer is what `build` would have made (the same variables, names and
order). Given others (a custom step that applies a subset, or the variables
of two models), it builds the optimizer for them inside the trace, as
without this module, and TensorFlow traces the step again; the guessed
variables were never tracked and are dropped. Under a `tf.distribute`
strategy nothing is guessed: variables belong in its scope.

Made eagerly is not enough: `tf.function` records every variable made while
it traces for the first time, `tf.init_scope` or not, and a recorded
variable is what makes it trace again. `made_eagerly` makes them with lifting
turned off (`tf.Variable`'s `experimental_enable_variable_lifting`), which
`tf.function` does not record.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import tensorflow as tf


def variables_to_build_for(state, record) -> list:
    """The trainable variables of the one model the step's forward pass
    entered (`record`, its `StepRecord`), for which to make the scale
    variables of `state` (a `_state.ScaleState`) ahead of `apply`; empty if
    they are made already, under a distribution strategy, or where the
    forward pass entered no model or several."""
    if state.built or tf.distribute.has_strategy():
        return []
    entered = [layer() for layer in record.entered]
    if len(entered) != 1 or entered[0] is None:
        return []
    return list(entered[0].trainable_variables)


def made_for(state, trainable_variables: Sequence | None) -> bool:
    """Whether the scale variables of `state` were made for exactly
    `trainable_variables`, in the same order."""
    if not state.built or trainable_variables is None:
        return False
    given, guessed = list(trainable_variables), state.trainable_variables
    return len(given) == len(guessed) and all(a is b for a, b in zip(given, guessed))


@contextlib.contextmanager
def made_eagerly() -> Iterator[None]:
    """A scope in which variables are made eagerly, even inside a trace, and
    are not recorded by the `tf.function` tracing (see above)."""

    def not_lifted(next_creator, **kwargs):
        kwargs["experimental_enable_variable_lifting"] = False
        return next_creator(**kwargs)

    with tf.init_scope(), tf.variable_creator_scope(not_lifted):
        yield
