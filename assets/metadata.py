"""Small helpers that turn stage results into Dagster metadata values."""

from __future__ import annotations

import math
import re
from typing import Any

import polars as pl


def markdown_table(frame: pl.DataFrame, limit: int = 20) -> str:
    if frame.height == 0:
        return "(none)"
    head = frame.head(limit)
    lines = ["| " + " | ".join(head.columns) + " |", "|" + "---|" * len(head.columns)]
    for row in head.iter_rows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")[:200] for v in row) + " |")
    if frame.height > limit:
        lines.append(f"\n… {frame.height - limit} more rows")
    return "\n".join(lines)


# -- numbers the Dagster UI plots across materializations -------------------------------------
#
# The UI draws a plot for every numeric metadata key an asset keeps across its materializations,
# so the keys must not change when nothing about their meaning did: a checkpoint is named by its
# stage (`sft`, `cispo`), never by its adapter path, which changes with every retrain.

BENCHMARK_METRICS = ("answer_found", "recall", "precision", "f1", "trajectory_recall", "mean_prompt_tokens")


def candidate_label(spec: str, checkpoints: dict[str, str]) -> str:
    """A candidate's stable name in metadata keys: its stage for our checkpoints, the spec
    itself for baselines (`hybrid`, `heuristic@4`), the spec with separators replaced otherwise."""
    label = checkpoints.get(spec, spec)
    return re.sub(r"[^A-Za-z0-9_.@-]+", "_", label).strip("_") or "candidate"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def benchmark_numbers(reports: dict[str, dict[str, Any]], checkpoints: dict[str, str] | None = None) -> dict[str, float]:
    """`SUITE/CANDIDATE/METRIC` -> value for every suite's report (report.json objects)."""
    checkpoints = checkpoints or {}
    numbers: dict[str, float] = {}
    for suite, report in sorted(reports.items()):
        for spec, summary in report["policies"].items():
            for metric in BENCHMARK_METRICS:
                value = _number(summary.get(metric))
                if value is not None:
                    numbers[f"{suite}/{candidate_label(spec, checkpoints)}/{metric}"] = value
    return numbers


def suite_numbers(prefix: str, metrics: dict[str, dict[str, Any]]) -> dict[str, float]:
    """`PREFIX/SUITE/METRIC` -> value from `{suite: {metric: value}}` (the served policy's figures)."""
    return {f"{prefix}/{suite}/{metric}": value for suite, values in sorted(metrics.items()) for metric in BENCHMARK_METRICS
            if (value := _number(values.get(metric))) is not None}


def training_numbers(stage: str, metrics: dict[str, Any]) -> dict[str, float]:
    """`loss` and `reward` (and what they are made of) of a checkpoint under the same keys for
    every materialization: SFT's loss is its last logged loss (the run's mean when none was
    logged); CISPO's loss and reward are the means over its last window of steps."""
    numbers: dict[str, float] = {}
    if stage == "sft":
        loss = _number(metrics.get("final_loss"))
        numbers["loss"] = loss if loss is not None else _number(metrics.get("train_loss"))
        numbers["first_loss"] = _number(metrics.get("first_loss"))
    else:
        numbers["loss"] = _number(metrics.get("loss"))
        numbers["reward"] = _number(metrics.get("reward_mean"))
        numbers["first_reward"] = _number(metrics.get("first_reward_mean"))
        for name, value in sorted((metrics.get("reward_components") or {}).items()):
            numbers[f"reward/{name}"] = _number(value)
        for name in ("answer_found", "recall", "trajectory_recall", "clip_ratio", "entropy"):
            numbers[name] = _number(metrics.get(name))
    return {key: value for key, value in numbers.items() if value is not None}
