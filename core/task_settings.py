"""The customer file's `tasks:` section: how synthetic search tasks are generated, verified and split.

Why in core: the customer file is validated whole when it is loaded (`core.config`), so every
section's model lives below the stages that read it; `synth` runs these settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# The corpus's domain: it picks the generator's prompt packs, and `code` makes source files seeds.
Domain = Literal["web", "finance", "legal", "email", "code"]
QuestionStyle = Literal["cloze", "natural"]

DEFAULT_MAX_HOPS = 4

DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)


class TaskGenConfig(BaseModel):
    """Settings of one generation run (the asset's run config mirrors these fields)."""

    model_config = ConfigDict(extra="forbid")

    generator: Literal["extractive", "llm"] = "extractive"
    # The offline generator's wording: masked clues (`cloze`) or wh-questions (`natural`); see synth.extractive.
    question_style: QuestionStyle = "cloze"
    domain: Domain = "web"
    seed: int = 0
    max_seeds: int = Field(200, ge=1)
    max_hops: int = Field(DEFAULT_MAX_HOPS, ge=1, le=8)
    docs_per_task: int = Field(3, ge=1)
    distractors_per_task: int = Field(10, ge=0)
    distractor_query_k: int = Field(20, ge=1)
    llm_distractor_check: bool = True
    extraction_attempts: int = Field(3, ge=1)
    max_turns: int = Field(10, ge=2)
    search_k: int = Field(5, ge=1)
    read_chars: int = Field(6000, ge=200)
    verify_doc_chars: int = Field(30_000, ge=200)
    split_fractions: tuple[float, float, float] = DEFAULT_FRACTIONS
    split_salt: str = ""
    workers: int = Field(4, ge=1)
    exclude_kinds: list[str] | None = None  # default: source code is not a seed unless domain is code

    def excluded_kinds(self) -> tuple[str, ...]:
        if self.exclude_kinds is not None:
            return tuple(self.exclude_kinds)
        return () if self.domain == "code" else ("code",)
