"""Report figures with matplotlib's Agg backend (no display; safe in threads of a Dagster run).

Two figures: one bar panel per metric with 95% intervals, and recall against mean prompt tokens
(what each candidate pays for what it finds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from evaluation.aggregate import RATE_METRICS

_LABELS = {
    "answer_found": "answer found", "recall": "recall", "precision": "precision", "f1": "F1",
    "trajectory_recall": "trajectory recall", "prune_accuracy": "prune accuracy",
}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _errors(summary: dict[str, Any], metric: str) -> tuple[float, float, float]:
    value = summary.get(metric)
    low, high = (summary.get("intervals", {}).get(metric) or [None, None])[:2]
    if value is None:
        return 0.0, 0.0, 0.0
    return value, max(0.0, value - low) if low is not None else 0.0, max(0.0, high - value) if high is not None else 0.0


def plot_metric_bars(policies: dict[str, dict[str, Any]], path: str | Path) -> Path:
    plt = _pyplot()
    names = list(policies)
    fig, axes = plt.subplots(2, 3, figsize=(13, 7), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for ax, metric in zip(axes.flat, RATE_METRICS):
        values, lows, highs = zip(*(_errors(policies[name], metric) for name in names)) if names else ((), (), ())
        ax.bar(range(len(names)), values, yerr=[lows, highs], capsize=4, color=[colors(i % 10) for i in range(len(names))])
        for i, name in enumerate(names):
            if policies[name].get(metric) is None:
                ax.text(i, 0.02, "n/a", ha="center", fontsize=8)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylim(0, 1.05)
        ax.set_title(_LABELS[metric])
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("Per-candidate means with 95% bootstrap intervals")
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_recall_vs_tokens(policies: dict[str, dict[str, Any]], path: str | Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5), constrained_layout=True)
    colors = plt.get_cmap("tab10")
    for i, (name, summary) in enumerate(policies.items()):
        x = summary.get("mean_prompt_tokens") or 0.0
        y, low, high = _errors(summary, "recall")
        ax.errorbar([x], [y], yerr=[[low], [high]], fmt="o", color=colors(i % 10), capsize=4, label=name)
        af = summary.get("answer_found")
        if af is not None:
            ax.scatter([x], [af], marker="^", color=colors(i % 10), alpha=0.6)
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xlabel("mean prompt tokens per task (summed over turns)")
    ax.set_ylabel("output recall (o) / answer found (^)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
