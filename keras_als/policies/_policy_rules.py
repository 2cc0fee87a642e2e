"""The rules that choose the next scales from the last step's statistics:
`MaxSafe`, `ApproxRange` (the paper's) and `Fixed`.

Each is a frozen dataclass, a pure function of (statistics, scale) whose only
state is its parameters. Public as `keras_als.policies`; the docstring
examples run there.
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from keras_als.policies._policy_terms import FLOAT16_MAX, FLOAT16_TINY, Statistics

BLIND_GROWTH = 2.0**16  # growth of a scale whose gradients were all zero


@keras.saving.register_keras_serializable(package="keras_als")
@dataclasses.dataclass(frozen=True)
class MaxSafe:
    """The largest power of two that keeps the largest gradient finite.

    `scale = 2**floor(log2(FLOAT16_MAX / amax)) / 2**margin`, from the last
    step's largest gradient value (delayed scaling, as in NVIDIA Transformer
    Engine's amax recipe). The `margin` absorbs growth from one batch to the
    next and sums inside a layer's backward pass that the statistics do not
    see; a component whose gradients were all zero grows by `BLIND_GROWTH`.

    The default margin was measured: a CNN with BatchNormalization on digits
    (Adam, 456 steps, 3 seeds) skipped 2.3, 1.3, 1.0, 1.0, 0.0 and 0.0 steps a
    run with margins 1, 2, 3, 4, 6 and 8, at equal accuracy; 6 is the smallest
    margin at which no seed skipped. Six powers of two of headroom still keep
    about 33 binades of float16 below the largest gradient.

    Args:
        margin: Powers of two of headroom below `FLOAT16_MAX`.

    Example:

    >>> stats = Statistics(amax=np.array([1.0, 0.0], np.float32),
    ...                    mean_square=np.zeros(2, np.float32),
    ...                    overflow=np.zeros(2, bool))
    >>> next_scale(MaxSafe(margin=2), stats, np.ones(2, np.float32)).numpy()
    array([ 8192., 65536.], dtype=float32)
    """

    margin: int = 6

    def __post_init__(self):
        if not isinstance(self.margin, int) or self.margin < 0:
            raise ValueError(f"MaxSafe(margin=...) takes a whole number >= 0, got {self.margin!r}.")

    def __call__(self, statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
        amax = tf.convert_to_tensor(statistics.amax, tf.float32)
        scale = tf.convert_to_tensor(scale, tf.float32)
        safe = FLOAT16_MAX / 2.0**self.margin / tf.maximum(amax, 1e-38)
        return tf.where(amax > 0, safe, scale * BLIND_GROWTH)

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)


@keras.saving.register_keras_serializable(package="keras_als")
@dataclasses.dataclass(frozen=True)
class ApproxRange:
    """The paper's rule: bound the expected underflow rate of each layer.

    Zhao, Vogel and Ahmed (2019) model a layer's input gradient as a zero-mean
    Gaussian with standard deviation `sd` and choose the scale at which at most
    `underflow_rate` of it falls below `u_min = FLOAT16_TINY`:

        z = sqrt(2) * erfinv(underflow_rate)
        alpha = u_min / (z * sd) / P        # P: scale the gradient arrives with
        alpha = clip(alpha, 1, max_ratio)   # per-layer bound (paper: 16)
        scale = min(P * alpha, max_scale)   # accumulated bound (paper: 1024)
        scale = min(scale, FLOAT16_MAX / amax)   # overflow bound

    rounded down to a power of two. The paper predicts `sd` from moments of the
    incoming gradient and of the weights because it has no earlier step; here
    `sd` is measured on the previous step (`sqrt(mean_square)`), and `P` is the
    smallest current scale among the components downstream (1 for the loss's).
    The defaults are the paper's; `max_ratio=None, max_scale=None` lifts the
    bounds, which cap very deep nets far below what they need.

    Args:
        underflow_rate: Tolerated expected share of underflowing values.
        max_ratio: Largest ratio between a component and its downstream, or None.
        max_scale: Largest absolute scale, or None.

    Example:

    >>> stats = Statistics(amax=np.array([1e-6], np.float32),
    ...                    mean_square=np.array([1e-14], np.float32),
    ...                    overflow=np.zeros(1, bool), downstream=((),))
    >>> next_scale(ApproxRange(), stats, np.ones(1, np.float32)).numpy()  # capped at 16
    array([16.], dtype=float32)
    """

    underflow_rate: float = 1e-3
    max_ratio: float | None = 16.0
    max_scale: float | None = 1024.0

    def __post_init__(self):
        if not 0.0 < self.underflow_rate < 1.0:
            raise ValueError(
                "ApproxRange(underflow_rate=...) must lie strictly between 0 and 1, "
                f"got {self.underflow_rate!r}."
            )
        for name in ("max_ratio", "max_scale"):
            value = getattr(self, name)
            if value is not None and not value >= 1.0:
                raise ValueError(f"ApproxRange({name}=...) must be None or >= 1, got {value!r}.")

    def __call__(self, statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
        amax = tf.convert_to_tensor(statistics.amax, tf.float32)
        scale = tf.convert_to_tensor(scale, tf.float32)
        mean_square = tf.convert_to_tensor(statistics.mean_square, tf.float32)
        z = math.sqrt(2.0) * _erfinv(self.underflow_rate)
        sd = tf.sqrt(mean_square)
        target = FLOAT16_TINY / (z * tf.maximum(sd, 1e-38))
        arriving = _arriving_scale(statistics, scale)
        ratio = tf.maximum(target / arriving, 1.0)
        if self.max_ratio is not None:
            ratio = tf.minimum(ratio, self.max_ratio)
        proposed = arriving * ratio
        if self.max_scale is not None:
            proposed = tf.minimum(proposed, self.max_scale)
        proposed = tf.where(
            amax > 0, tf.minimum(proposed, FLOAT16_MAX / tf.maximum(amax, 1e-38)), proposed
        )
        return tf.where(sd > 0, proposed, scale)

    def get_config(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)


def _erfinv(y: float) -> float:
    """Inverse error function for 0 < y < 1, by Newton's method on `math.erf`."""
    x = 0.0
    for _ in range(100):
        step = (math.erf(x) - y) / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
        x -= step
        if abs(step) < 1e-15:
            break
    return x


def _arriving_scale(statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
    """Per component, the smallest scale among the components downstream of it."""
    n = int(scale.shape[0])
    downstream = statistics.downstream or ((),) * n
    arriving = [
        tf.reduce_min(tf.gather(scale, list(d))) if d else tf.constant(1.0) for d in downstream
    ]
    return tf.stack(arriving) if arriving else scale


@keras.saving.register_keras_serializable(package="keras_als")
@dataclasses.dataclass(frozen=True)
class Fixed:
    """Given scales, for baselines and tests: `scales[name]`, else `default`.

    Args:
        default: Scale of every component not named in `scales`.
        scales: Scale per component name (a wrapped layer's name or `"loss"`).

    Example:

    >>> stats = Statistics(amax=np.ones(2), mean_square=np.ones(2),
    ...                    overflow=np.zeros(2, bool), names=("loss", "dense"))
    >>> next_scale(Fixed(scales={"dense": 8.0}), stats, np.ones(2)).numpy()
    array([1., 8.], dtype=float32)
    """

    default: float = 1.0
    scales: dict[str, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        for value in [self.default, *self.scales.values()]:
            if not (value > 0 and math.frexp(value)[0] == 0.5):
                raise ValueError(f"Fixed scales must be powers of two (2.0**k), got {value!r}.")

    def __hash__(self):
        return hash((self.default, tuple(sorted(self.scales.items()))))

    def __call__(self, statistics: Statistics, scale: tf.Tensor) -> tf.Tensor:
        n = int(np.shape(scale)[0])
        names = statistics.names or ("",) * n
        return tf.constant([self.scales.get(name, self.default) for name in names], tf.float32)

    def get_config(self) -> dict:
        return {"default": self.default, "scales": dict(self.scales)}

    @classmethod
    def from_config(cls, config: dict):
        return cls(**config)
