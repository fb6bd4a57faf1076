"""Figures for the SFT assets' metadata: recall histograms before/after the filter, the loss curve.

matplotlib's Agg backend (no display; safe inside a Dagster run's threads); each helper writes
one PNG and returns its path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_recall_histograms(
    before: Mapping[str, Sequence[float]], after: Mapping[str, Sequence[float]], path: str | Path, bins: int = 10
) -> Path:
    """One panel per recall (trajectory, output): all rollouts vs the ones the filter kept."""
    plt = _pyplot()
    keys = [key for key in ("trajectory_recall", "output_recall") if key in before or key in after]
    fig, axes = plt.subplots(1, max(1, len(keys)), figsize=(5 * max(1, len(keys)), 3.6), constrained_layout=True, squeeze=False)
    edges = [i / bins for i in range(bins + 1)]
    for ax, key in zip(axes[0], keys):
        ax.hist(list(before.get(key, [])), bins=edges, alpha=0.5, label=f"all ({len(before.get(key, []))})", color="tab:gray")
        ax.hist(list(after.get(key, [])), bins=edges, alpha=0.8, label=f"kept ({len(after.get(key, []))})", color="tab:blue")
        ax.set_title(key.replace("_", " "))
        ax.set_xlabel("recall")
        ax.set_ylabel("rollouts")
        ax.legend()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_loss_curve(points: Sequence[tuple[int, float]], path: str | Path, title: str = "SFT loss") -> Path:
    """Training loss per logged optimizer step."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.6), constrained_layout=True)
    if points:
        steps, losses = zip(*points)
        ax.plot(steps, losses, marker="o" if len(points) < 40 else None, color="tab:blue")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (assistant tokens)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
