"""What the step-time and memory studies measure, as the suite's targets and
tables read it: one module that `cost`, `memory`, `targets` and `tables` all
import, so that none of them imports another to reach the records."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class Timing:
    """Interleaved step times of keras_als (max_safe) and Keras LSO on one model.

    Attributes:
        model: Model name.
        method: The keras_als variant timed (default: `"als_max_safe"`).
        layers: Number of wrapped layers (scale boundaries).
        als_ms: Median step time of keras_als, milliseconds.
        lso_ms: Median step time of Keras LSO, milliseconds.
        ratio: Median over rounds of the time ratio keras_als / Keras LSO
            (each the mean over its instances).
        blocks: Number of rounds.
        steps_per_block: Steps in each timed block.
        instances: Independently built instances of each method.
        lso_spread: Slowest over fastest Keras LSO instance (median times):
            how far two instances of one configuration differ (the noise floor).
        ratio_se: Standard error of the ratio from the instances' spread
            (`stats.ratio_and_standard_error` of their median step times;
            NaN with one instance of a method, or in results saved without it).
    """

    model: str
    method: str
    layers: int
    als_ms: float
    lso_ms: float
    ratio: float
    blocks: int
    steps_per_block: int
    instances: int = 1
    lso_spread: float = 1.0
    ratio_se: float = float("nan")

    @property
    def overhead_ms(self) -> float:
        """Extra time per step of keras_als, milliseconds (may be negative: noise)."""
        return self.als_ms - self.lso_ms


@dataclasses.dataclass
class Memory:
    """Memory of one model under one method.

    Attributes:
        model: Model name.
        method: `"keras_lso"` or `"als_max_safe"`.
        xla_bytes: XLA buffer assignment total of the compiled step (largest
            compiled version of the step).
        peak_rss_mb: Peak resident set size of the process, MiB.
        rss_growth_mb: Peak RSS minus RSS before the first step, MiB.
        xla_peak_bytes: Bytes live at once at the peak of the same step
            (XLA's "peak usage"); None in results saved before it was read.
    """

    model: str
    method: str
    xla_bytes: int
    peak_rss_mb: float
    rss_growth_mb: float
    xla_peak_bytes: int | None = None
