"""Curves of a CISPO run for the `cispo_checkpoint` asset's metadata (one PNG, Agg backend).

Six panels over steps, from the `metrics.jsonl` rows `train_cispo` writes: the reward with its
main components (the answer bonus, F_beta, trajectory recall, penalties), answer found and
recall, the entropy proxy (collapse shows here first), the clip ratio, kept vs dropped groups,
and where a step's time goes.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _series(rows: Sequence[dict[str, Any]], get) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for row in rows:
        value = get(row)
        if value is not None:
            steps.append(row["step"])
            values.append(float(value))
    return steps, values


def plot_cispo_curves(rows: Sequence[dict[str, Any]], path: str | Path, title: str = "CISPO") -> Path:
    """Write the run's curves to `path` (PNG) and return it."""
    plt = _pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(14, 7), constrained_layout=True)
    marker = "o" if len(rows) < 40 else None
    panels = [
        ("reward", [("reward", lambda r: r.get("reward_mean")),
                    ("answer bonus", lambda r: (r.get("reward_components") or {}).get("answer_found")),
                    ("F_beta", lambda r: (r.get("reward_components") or {}).get("f_beta")),
                    ("traj. recall", lambda r: (r.get("reward_components") or {}).get("trajectory_recall")),
                    ("penalties", lambda r: sum((r.get("reward_components") or {}).get(k, 0.0) for k in ("p_prune", "p_turn")))]),
        ("retrieval", [("answer found", lambda r: r.get("answer_found")), ("recall", lambda r: r.get("recall"))]),
        ("entropy proxy (nats/token)", [("entropy", lambda r: r.get("entropy_proxy"))]),
        ("importance weights", [("clip ratio", lambda r: r.get("clip_ratio")), ("mean ratio - 1", lambda r: None if r.get("ratio_mean") is None else r["ratio_mean"] - 1)]),
        ("groups", [("kept", lambda r: r.get("groups_kept")), ("dropped", lambda r: r.get("groups_dropped"))]),
        ("seconds per step", [(k.removesuffix("_s"), lambda r, k=k: (r.get("time") or {}).get(k))
                              for k in ("rollout_s", "scoring_s", "training_s", "sync_s")]),
    ]
    for ax, (name, lines) in zip(axes.flat, panels):
        for label, get in lines:
            steps, values = _series(rows, get)
            if steps:
                ax.plot(steps, values, marker=marker, label=label)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
