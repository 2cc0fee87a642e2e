"""Means, standard errors and differences paired by seed."""

from __future__ import annotations

import math
import statistics


def mean_and_standard_error(values: list[float]) -> tuple[float, float]:
    """Mean of `values` and its standard error (nan with fewer than two values)."""
    if len(values) < 2:
        return (values[0] if values else float("nan")), float("nan")
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def paired_by_seed(ours: dict, theirs: dict, scale: float = 1.0) -> tuple[float, float, int]:
    """`scale * (ours - theirs)` over the seeds both have: `(mean, s.e., seeds)`.

    The mean is NaN where there is no seed or a difference is not finite; the
    standard error is NaN with fewer than two seeds (`mean_and_standard_error`).
    """
    differences = [scale * (ours[s] - theirs[s]) for s in sorted(ours) if s in theirs]
    if not differences or not all(math.isfinite(d) for d in differences):
        return float("nan"), float("nan"), len(differences)
    return (*mean_and_standard_error(differences), len(differences))


def mean_sd(values: list[float], digits: int) -> str:
    """`"mean ± sd"` of the finite `values` to `digits` decimals, saying how many
    were not finite; `"not finite"` when none is."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return "not finite"
    text = f"{statistics.fmean(finite):.{digits}f}"
    if len(finite) > 1:
        text += f" ± {statistics.stdev(finite):.{digits}f}"
    if len(finite) < len(values):
        text += f" ({len(values) - len(finite)} not finite)"
    return text


def ratio_and_standard_error(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    """Geometric mean of `ours` over that of `theirs`, and its standard error.

    Each list holds one median step time per instance. The log ratio is the
    difference of the mean logs; its standard error combines both groups'
    spread, `sqrt(var(log ours) / n + var(log theirs) / m)` (sample variances),
    carried to the ratio as `ratio * that` (first order). NaN with fewer than
    two instances in a group.
    """
    (log_ours, error_ours), (log_theirs, error_theirs) = (
        mean_and_standard_error([math.log(v) for v in values]) for values in (ours, theirs)
    )
    ratio = math.exp(log_ours - log_theirs)
    return ratio, ratio * math.hypot(error_ours, error_theirs)


def paired_ratio_and_standard_error(ours: list[float], theirs: list[float]) -> tuple[float, float]:
    """Geometric mean of `ours[i] / theirs[i]` and its standard error.

    The pairs are measured side by side (one round of fresh processes each),
    so a drift of the machine between rounds cancels in each ratio. The
    standard error is that of the mean log ratio, carried to the ratio as
    `ratio * that` (first order); NaN with fewer than two pairs.
    """
    if len(ours) != len(theirs):
        raise ValueError(f"unpaired: {len(ours)} values against {len(theirs)}")
    log_ratio, error = mean_and_standard_error([math.log(a / b) for a, b in zip(ours, theirs)])
    ratio = math.exp(log_ratio)
    return ratio, ratio * error
