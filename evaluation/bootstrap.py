"""Means with percentile-bootstrap 95% intervals, deterministic under a seed.

Why bootstrap: per-task metrics are bounded and often binary (answer found), so a normal
interval misbehaves at small n and near 0 or 1; resampling tasks makes no such assumption. Why
one seeded generator per call: the same scores always give the same interval, so reports can be
diffed and a regression gate does not flap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


def paired_difference(
    ours: Mapping[str, float],
    theirs: Mapping[str, float],
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = DEFAULT_SEED,
) -> Interval:
    """Mean of `ours - theirs` over the same tasks, with a percentile interval that resamples tasks.

    Why paired: two rows on the same questions share most of their variance (an easy question is
    easy for both), so the interval of the difference is far narrower than the two rows'
    intervals side by side suggest; whether a student beats a baseline is a question about the
    difference. Both must score exactly the same tasks: a missing task is an error, not a skip.
    """
    missing = sorted(set(ours) ^ set(theirs))
    if missing:
        raise ValueError(f"paired difference over different tasks: {len(missing)} scored on one side only, e.g. {missing[:3]}")
    tasks = sorted(ours)
    return bootstrap_mean([ours[task] - theirs[task] for task in tasks], resamples=resamples, confidence=confidence, seed=seed)
