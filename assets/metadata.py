"""Small helpers that turn stage results into Dagster metadata values."""

from __future__ import annotations

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
