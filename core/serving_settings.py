"""The customer file's `serving:` section: the promotion gate's thresholds and the vLLM server to load adapters into."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

TEST_SUITE = "test"
RateMetric = Literal["answer_found", "recall", "precision", "f1", "trajectory_recall"]


class PromotionSettings(BaseModel):
    """The customer file's `promotion:` section."""

    model_config = ConfigDict(extra="forbid")

    margin: float = Field(0.01, ge=0.0, le=1.0)  # required gain in test answer found over the served policy
    tolerance: float = Field(0.02, ge=0.0, le=1.0)  # largest allowed drop on any suite and regression metric
    regression_metrics: list[RateMetric] = Field(default_factory=lambda: ["answer_found"])
    eligible: list[str] = Field(default_factory=lambda: ["heuristic", "transformers:*"])  # fnmatch patterns on specs
    allow_nx: bool = False
    test_suite: str = TEST_SUITE


class ServingSettings(BaseModel):
    """The customer file's `serving:` section."""

    model_config = ConfigDict(extra="forbid")

    promotion: PromotionSettings = Field(default_factory=PromotionSettings)
    # A running vLLM server for this customer's base model (OpenAI base URL, e.g.
    # http://10.0.0.5:8000/v1, started with --enable-lora and runtime LoRA updating). Promoted
    # adapters are loaded into it; without it the served adapter runs in-process (transformers).
    vllm_url: str | None = None
    vllm_api_key_env: str | None = None
    tool_call_parser: str | None = None  # default: by base model family
