"""The customer file's `benchmark:` section: which candidates the benchmark runs, on what, at which k."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.harness_settings import HarnessOverrides

BASELINES = ["bm25", "dense", "hybrid", "heuristic"]


class BenchmarkSettings(BaseModel):
    """The customer file's `benchmark:` section."""

    model_config = ConfigDict(extra="forbid")

    k: int = Field(5, ge=1)
    policies: list[str] = Field(default_factory=lambda: list(BASELINES))
    external: list[str] = Field(default_factory=list)  # benchmark JSONL files, relative to the customer file
    external_limit: int | None = Field(None, ge=1)
    test_limit: int | None = Field(None, ge=1)
    workers: int | None = Field(None, ge=1)
    # Options for model-backed candidates (checkpoints, endpoints), e.g. {max_new_tokens: 256}:
    # a CPU demo bounds what an undertrained model may generate per turn.
    model_options: dict = Field(default_factory=dict)
    harness: HarnessOverrides = Field(default_factory=HarnessOverrides)  # for every agent candidate
    # Which training checkpoints join as candidates: `all` (SFT and CISPO) or `latest` (the last
    # stage trained; halves what a CPU demo spends generating).
    checkpoints: Literal["all", "latest"] = "all"
    # When the customer has a reranker (`training.reranker`), these also run as `POLICY+rerank`:
    # the same candidate with selection by the reranker over what it surfaced.
    rerank: list[str] = Field(default_factory=lambda: ["hybrid", "heuristic"])
