"""The benchmark report: `report.json` (the contract), `report.md` (a table) and the plots.

`report.json` is `{"policies": {name: summary}, "config": {...}, "files": {...}}`; each summary
has at least `answer_found, recall, precision, f1, trajectory_recall, prune_accuracy,
mean_prompt_tokens, n` (DESIGN.md) plus intervals, costs and per-group means. `config` names
every stand-in that produced the numbers (embedding model, policies, harness settings), so a
figure is never quoted without what made it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

TABLE_COLUMNS = (
    ("answer_found", "answer found", "rate"),
    ("recall", "recall", "rate"),
    ("precision", "precision", "rate"),
    ("f1", "F1", "rate"),
    ("trajectory_recall", "traj. recall", "rate"),
    ("prune_accuracy", "prune acc.", "rate"),
    ("final_answers", "final answers", "num"),
    ("turns", "turns", "num"),
    ("tool_calls_per_turn", "calls/turn", "num"),
    ("mean_prompt_tokens", "prompt tok.", "int"),
    ("peak_tokens", "peak tok.", "int"),
    ("wall_s", "s/task", "num"),
    ("n", "n", "int"),
)


def _cell(summary: dict[str, Any], key: str, kind: str) -> str:
    value = summary.get(key)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if kind == "rate":
        low, high = (summary.get("intervals", {}).get(key) or [None, None])[:2]
        ci = f" [{low:.2f}, {high:.2f}]" if low is not None and high is not None else ""
        return f"{value:.3f}{ci}"
    if kind == "int":
        return f"{int(round(value)):,}"
    return f"{value:.2f}"


def markdown_table(policies: dict[str, dict[str, Any]]) -> str:
    header = "| policy | " + " | ".join(label for _, label, _ in TABLE_COLUMNS) + " |"
    rule = "|---|" + "|".join("---:" for _ in TABLE_COLUMNS) + "|"
    rows = [f"| {name} | " + " | ".join(_cell(s, key, kind) for key, _, kind in TABLE_COLUMNS) + " |" for name, s in policies.items()]
    return "\n".join([header, rule, *rows])


def group_table(policies: dict[str, dict[str, Any]]) -> str | None:
    groups = sorted({g for s in policies.values() for g in s.get("by_group", {})})
    if not groups:
        return None
    header = "| policy | " + " | ".join(f"{g} answer found / recall (n)" for g in groups) + " |"
    rule = "|---|" + "|".join("---:" for _ in groups) + "|"
    rows = []
    for name, summary in policies.items():
        cells = []
        for group in groups:
            g = summary.get("by_group", {}).get(group)
            cells.append(f"{g['answer_found']:.3f} / {g['recall']:.3f} ({g['n']})" if g else "–")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join([header, rule, *rows])


def render_markdown(report: dict[str, Any]) -> str:
    config = report.get("config", {})
    lines = [
        f"# Benchmark: {Path(str(config.get('tasks_file', 'tasks'))).name}",
        "",
        f"k = {config.get('k')} documents per candidate; {config.get('n_tasks')} questions; "
        f"95% bootstrap intervals ({config.get('bootstrap_resamples')} resamples, seed {config.get('seed')}); "
        f"scoring at {config.get('granularity', 'document')} level.",
        "",
        markdown_table(report["policies"]),
        "",
    ]
    groups = group_table(report["policies"])
    if groups:
        lines += ["By source dataset:", "", groups, ""]
    errors = {name: s["errors"] for name, s in report["policies"].items() if s.get("errors")}
    if errors:
        lines += [f"Episodes that ended in a policy error (scored as returned): {errors}", ""]
    stand_ins = config.get("stand_ins") or {}
    if stand_ins:
        lines += ["Produced with: " + "; ".join(f"{key}: {value}" for key, value in stand_ins.items()), ""]
    lines += [
        "Notes: prompt tokens are summed over turns (and over rollouts for POLICY@N); baselines use no model "
        "(0 tokens). Prune accuracy is over the tasks that pruned. Answer found: a returned document contains the "
        "answer as whole words; for answers in no gold document (yes/no), every gold document must be returned.",
        "",
    ]
    for plot in report.get("files", {}).get("plots", []):
        lines.append(f"![{Path(plot).stem}]({Path(plot).name})")
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Any]:
    """Write report.json, report.md and the plots into `out_dir`; returns the report with `files`."""
    from evaluation.plots import plot_metric_bars, plot_recall_vs_tokens

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [
        str(plot_metric_bars(report["policies"], out_dir / "metrics.png")),
        str(plot_recall_vs_tokens(report["policies"], out_dir / "recall_vs_tokens.png")),
    ]
    files = dict(report.get("files", {}))
    files.update({"report_json": str(out_dir / "report.json"), "report_md": str(out_dir / "report.md"), "plots": plots})
    report = {**report, "files": files}
    (out_dir / "report.json").write_text(json.dumps(report, indent=2, default=str, allow_nan=False) + "\n")
    (out_dir / "report.md").write_text(render_markdown(report))
    return report
