"""Means with percentile-bootstrap 95% intervals, deterministic under a seed.

Why bootstrap: per-task metrics are bounded and often binary (answer found), so a normal
interval misbehaves at small n and near 0 or 1; resampling tasks makes no such assumption. Why
one seeded generator per call: the same scores always give the same interval, so reports can be
diffed and a regression gate does not flap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float
    high: float
    n: int

    def as_list(self) -> list[float]:
        return [self.low, self.high]


def bootstrap_mean(
    values: Sequence[float],
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Mean of `values` and its percentile interval; `None` entries must be dropped by the caller.

    No values gives NaNs (an unmeasured metric, e.g. prune accuracy of a policy that never
    prunes), one value gives a zero-width interval.
    """
    data = np.asarray(list(values), dtype=np.float64)
    if data.size == 0:
        return Interval(float("nan"), float("nan"), float("nan"), 0)
    mean = float(data.mean())
    if data.size == 1 or resamples <= 0:
        return Interval(mean, mean, mean, int(data.size))
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, data.size, size=(resamples, data.size))
    means = data[picks].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return Interval(mean, float(low), float(high), int(data.size))
