"""One trajectory schema, recorded whole, read by distillation, RL, evaluation and serving.

Why one schema: the SFT filter, the RL reward and the benchmark scorer must compute the same
numbers from the same record (the scorer *is* the reward). So an episode is stored with every
turn, every tool call with its arguments and result ids, the exact messages the model saw at
each turn (the context is not append-only once chunks are pruned, so SFT and CISPO train each
turn on its own view), the pruned ids, token counts, timings and the parsed final ranking.

Storage: JSONL (one trajectory per line, lossless) and Parquet through polars, where the
scalar summary fields are columns for querying and the full record is one JSON string column
(nested structs of free-form tool arguments do not map cleanly onto Arrow types).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field


class ToolCallRecord(BaseModel):
    """One executed tool call: what was asked, what came back (ids), what it cost."""

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    raw_arguments: str | None = None
    result_chunk_ids: list[str] = Field(default_factory=list)
    result_doc_ids: list[str] = Field(default_factory=list)
    # For prune_chunks: the ids actually removed from the view / reported as unknown.
    pruned_chunk_ids: list[str] = Field(default_factory=list)
    unknown_chunk_ids: list[str] = Field(default_factory=list)
    error: str | None = None
    rejected: bool = False  # refused by the hard cutoff (the call never reached the backend)
    tokens: int = 0  # tokens of the rendered result the model sees
    candidates: int = 0  # hits the backend returned before dedup and budget cuts
    wall_ms: float = 0.0
    backend_ms: float = 0.0


class Turn(BaseModel):
    """One observe -> infer -> act step."""

    index: int
    prompt_tokens: int  # size of the view (counted with the policy's tokenizer) the model was given
    view_messages: list[dict[str, Any]] = Field(default_factory=list)
    completion: str | None = None
    completion_tokens: int = 0
    completion_token_ids: list[int] | None = None
    completion_logprobs: list[float] | None = None
    raw_text: str | None = None  # the generated text (after `prefill`, which it does not repeat)
    prefill: str | None = None  # text the policy appended to the rendered prompt (forced final answer)
    policy_error: str | None = None  # a reply the policy could not parse into tool calls
    tool_calls: list[ToolCallRecord] = Field(default_factory=list)
    pruned_ids: list[str] = Field(default_factory=list)
    view_token_usage: int = 0  # view size after this turn's observation was appended
    hint_shown: bool = False
    past_hard_cutoff: bool = False
    forced_final: bool = False  # the harness asked for the final answer (max turns / overflow)
    timings: dict[str, float] = Field(default_factory=dict)


class RankedDocument(BaseModel):
    doc_id: str
    chunk_id: str | None = None
    title: str = ""
    justification: str = ""


class Trajectory(BaseModel):
    id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    question: str
    policy: str
    seed: int = 0
    task_id: str | None = None
    config: dict[str, Any] = Field(default_factory=dict)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    turns: list[Turn] = Field(default_factory=list)
    final_ranking: list[RankedDocument] = Field(default_factory=list)
    final_text: str | None = None
    parse_errors: list[str] = Field(default_factory=list)
    error: str | None = None
    stop_reason: str = ""  # answer | max_turns | overflow | policy_error
    started_at: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat())
    wall_s: float = 0.0
    peak_tokens: int = 0
    total_prompt_tokens: int = 0
    # chunk id -> doc id for every chunk ever shown, so scorers need no index to map them.
    chunk_docs: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)

    # ---- derived views used by the scorer, the SFT filter and the reward -------------------
    def tool_call_records(self) -> list[ToolCallRecord]:
        return [call for turn in self.turns for call in turn.tool_calls]

    def seen_chunk_ids(self) -> list[str]:
        """Every chunk ever shown to the model, in order, pruned ones included (trajectory recall)."""
        seen: dict[str, None] = {}
        for call in self.tool_call_records():
            for chunk_id in call.result_chunk_ids:
                seen.setdefault(chunk_id, None)
        return list(seen)

    def seen_doc_ids(self) -> list[str]:
        seen: dict[str, None] = {}
        for call in self.tool_call_records():
            for doc_id in call.result_doc_ids:
                seen.setdefault(doc_id, None)
        return list(seen)

    def pruned_chunk_ids(self) -> list[str]:
        pruned: dict[str, None] = {}
        for turn in self.turns:
            for chunk_id in turn.pruned_ids:
                pruned.setdefault(chunk_id, None)
        return list(pruned)

    def pruned_doc_ids(self) -> list[str]:
        return list(dict.fromkeys(self.chunk_docs[c] for c in self.pruned_chunk_ids() if c in self.chunk_docs))

    def output_doc_ids(self) -> list[str]:
        return [doc.doc_id for doc in self.final_ranking]

    def summary(self) -> dict[str, int]:
        """The one-line figures `searchsmith search` prints: turns, tool calls, peak tokens, pruned."""
        return {
            "turns": len(self.turns),
            "tool_calls": len(self.tool_call_records()),
            "peak_tokens": self.peak_tokens,
            "pruned": len(self.pruned_chunk_ids()),
        }


# ---- JSONL ---------------------------------------------------------------------------------


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for trajectory in trajectories:
            handle.write(trajectory.model_dump_json())
            handle.write("\n")
    return path


def read_jsonl(path: str | Path) -> list[Trajectory]:
    with Path(path).open(encoding="utf-8") as handle:
        return [Trajectory.model_validate_json(line) for line in handle if line.strip()]


# ---- Parquet -------------------------------------------------------------------------------

_PARQUET_RECORD = "trajectory_json"


def to_polars(trajectories: Iterable[Trajectory]):
    """A frame with queryable summary columns plus the whole record as JSON (lossless)."""
    import polars as pl

    rows = []
    for t in trajectories:
        summary = t.summary()
        rows.append(
            {
                "id": t.id,
                "task_id": t.task_id,
                "question": t.question,
                "policy": t.policy,
                "seed": t.seed,
                "stop_reason": t.stop_reason,
                "error": t.error,
                "n_parse_errors": len(t.parse_errors),
                "turns": summary["turns"],
                "tool_calls": summary["tool_calls"],
                "pruned": summary["pruned"],
                "peak_tokens": t.peak_tokens,
                "total_prompt_tokens": t.total_prompt_tokens,
                "wall_s": t.wall_s,
                "output_doc_ids": t.output_doc_ids(),
                "seen_doc_ids": t.seen_doc_ids(),
                "started_at": t.started_at,
                _PARQUET_RECORD: t.model_dump_json(),
            }
        )
    schema = {
        "id": pl.Utf8, "task_id": pl.Utf8, "question": pl.Utf8, "policy": pl.Utf8, "seed": pl.Int64,
        "stop_reason": pl.Utf8, "error": pl.Utf8, "n_parse_errors": pl.Int64, "turns": pl.Int64,
        "tool_calls": pl.Int64, "pruned": pl.Int64, "peak_tokens": pl.Int64,
        "total_prompt_tokens": pl.Int64, "wall_s": pl.Float64, "output_doc_ids": pl.List(pl.Utf8),
        "seen_doc_ids": pl.List(pl.Utf8), "started_at": pl.Utf8, _PARQUET_RECORD: pl.Utf8,
    }
    return pl.DataFrame(rows, schema=schema)


def write_parquet(trajectories: Iterable[Trajectory], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    to_polars(trajectories).write_parquet(path)
    return path


def read_parquet(path: str | Path) -> list[Trajectory]:
    import polars as pl

    frame = pl.read_parquet(path, columns=[_PARQUET_RECORD])
    return [Trajectory.model_validate_json(text) for text in frame[_PARQUET_RECORD].to_list()]


def trajectory_from_dict(data: dict[str, Any] | str) -> Trajectory:
    if isinstance(data, str):
        data = json.loads(data)
    return Trajectory.model_validate(data)
