"""Per-candidate summaries of task scores: means, 95% bootstrap intervals, per-group breakdowns.

Why intervals on every rate: candidates on a few hundred questions often differ by less than
the sampling noise; the report shows it so nobody promotes a checkpoint on noise. Prune accuracy
is averaged over the tasks that pruned (`prune_measured` says how many); with none it is null.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from evaluation.bootstrap import DEFAULT_RESAMPLES, DEFAULT_SEED, bootstrap_mean
from evaluation.metrics import TaskScore

RATE_METRICS = ("answer_found", "recall", "precision", "f1", "trajectory_recall", "prune_accuracy")
INTERVAL_METRICS = RATE_METRICS + ("mean_prompt_tokens", "turns")


def _finite(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def _values(scores: Sequence[TaskScore], metric: str) -> list[float]:
    if metric == "mean_prompt_tokens":
        return [float(s.total_prompt_tokens) for s in scores]
    values = [getattr(s, metric) for s in scores]
    return [float(v) for v in values if v is not None]


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def summarize_scores(
    scores: Sequence[TaskScore],
    groups: Sequence[str] | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, Any]:
    """The report's per-candidate object (the `searchsmith bench --json` keys and more)."""
    summary: dict[str, Any] = {}
    intervals: dict[str, list[float | None]] = {}
    for metric in INTERVAL_METRICS:
        interval = bootstrap_mean(_values(scores, metric), resamples=resamples, seed=seed)
        summary[metric] = _finite(interval.mean)
        intervals[metric] = [_finite(interval.low), _finite(interval.high)]
    summary["n"] = len(scores)
    summary["intervals"] = intervals
    summary["tool_calls_per_turn"] = _mean([s.tool_calls_per_turn for s in scores])
    summary["tool_calls"] = _mean([float(s.tool_calls) for s in scores])
    summary["peak_tokens"] = _mean([float(s.peak_tokens) for s in scores])
    summary["max_peak_tokens"] = max((s.peak_tokens for s in scores), default=0)
    summary["wall_s"] = _mean([s.wall_s for s in scores])
    summary["pruned_chunks"] = _mean([float(s.n_pruned) for s in scores])
    summary["prune_measured"] = sum(1 for s in scores if s.prune_accuracy is not None)
    summary["returned_docs"] = _mean([float(s.n_returned) for s in scores])
    # Episodes that ended with any document returned: for a model, a final answer the harness
    # could parse (a small model that answers in prose returns nothing); 1.0 for retrievers.
    summary["final_answers"] = _mean([1.0 if s.n_returned else 0.0 for s in scores])
    summary["errors"] = sum(1 for s in scores if s.error)
    if groups is not None and len(set(groups)) > 1:
        summary["by_group"] = summarize_groups(scores, groups)
    return summary


def summarize_groups(scores: Sequence[TaskScore], groups: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Means per group (e.g. HotpotQA vs MuSiQue), without intervals (the groups are small)."""
    by_group: dict[str, list[TaskScore]] = defaultdict(list)
    for score, group in zip(scores, groups):
        by_group[group or "(none)"].append(score)
    return {
        group: {
            "n": len(members),
            **{metric: _mean(_values(members, metric)) for metric in ("answer_found", "recall", "trajectory_recall", "mean_prompt_tokens")},
        }
        for group, members in sorted(by_group.items())
    }
