"""Typed settings for distillation: teacher rollouts, LoRA shape and SFT hyperparameters.

Why Pydantic models: a customer file carries them under `teacher:`, `lora:` and `sft:` and a
typo must fail at load time (`extra="forbid"`), not silently train with a default. A snapshot
(`model_dump()`) is written into the adapter's sidecar, so a checkpoint says how it was made.

Defaults are sized for the offline demo (SmolLM2-135M on 2 CPU cores, a few minutes); a GPU
customer raises `max_length`, `epochs` and `max_steps`. Precision and gradient checkpointing
are "auto": fp32 without checkpointing on CPU, bf16 with checkpointing on CUDA.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Every linear projection of a Llama/Qwen/SmolLM block; vLLM serves LoRA on exactly these.
DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TeacherSettings(_Strict):
    """How teacher trajectories are collected over the train split."""

    # `auto`: the customer's `teacher:` endpoint when it has one, else the offline heuristic;
    # `teacher`: that endpoint (an error without one); anything else is a `load_policy` spec.
    policy: str = "auto"
    k_rollouts: int = Field(1, ge=1, description="rollouts per task, seeds seed..seed+k-1")
    workers: int = Field(4, ge=1, description="concurrent episodes")
    seed: int = 0
    max_attempts: int = Field(2, ge=1, description="tries per rollout within one run before it is recorded as failed")
    max_tasks: int | None = Field(None, ge=1, description="cap on train tasks (demo runs)")
    filter_seed: int = 0
    k: int | None = Field(None, ge=1, description="output size the filter scores at (None: the whole ranking)")


class LoraSettings(_Strict):
    """The adapter's shape; saved into adapter_config.json by peft."""

    rank: int = Field(16, ge=1)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(default_factory=lambda: list(DEFAULT_TARGET_MODULES))


class SFTSettings(_Strict):
    """Optimisation and data-shaping settings of one SFT run."""

    learning_rate: float = Field(2e-4, gt=0)
    epochs: float = Field(1.0, gt=0)
    max_steps: int = Field(-1, description="> 0 caps the optimizer steps (overrides epochs)")
    max_length: int = Field(2048, ge=16, description="longer samples are reported and dropped, never truncated")
    max_samples: int | None = Field(None, ge=1, description="cap on training samples (seeded choice)")
    batch_size: int = Field(1, ge=1)
    grad_accum: int = Field(4, ge=1)
    warmup_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="share of the steps spent warming up")
    weight_decay: float = Field(0.0, ge=0.0)
    lr_scheduler: str = "linear"
    seed: int = 0
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    gradient_checkpointing: bool | None = None  # None: on with CUDA, off on CPU
    torch_threads: int | None = Field(
        None, ge=1, description="CPU threads; 1 is fastest for tiny models on a busy machine"
    )
    logging_steps: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SFTSettings:
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError("max_steps must be -1 (use epochs) or positive")
        return self


def lora_shape(lora: LoraSettings, profile: object | None) -> tuple[list[str], float]:
    """(target names, dropout) of the adapter for a base model with `profile`
    (`retrieval.policies.model_family.BaseModelProfile`, None when the folder is not here).

    `lora.target_modules` left unset means the family's targets (gpt-oss: attention and its fused
    experts); set, it is used as given (`model_family.lora_targets` tells modules from fused
    parameters). A family whose targets need it (peft's parameter targeting has no dropout)
    fixes an unset `lora.dropout`; a dropout set explicitly is kept (peft refuses a non-zero one
    on fused parameters, and `TrainingSettings` says so when the file is loaded)."""
    explicit = "target_modules" in lora.model_fields_set
    family_targets = getattr(profile, "lora_targets", None)
    targets = list(lora.target_modules) if explicit or not family_targets else list(family_targets)
    forced = getattr(profile, "lora_dropout", None)
    dropout = forced if forced is not None and "dropout" not in lora.model_fields_set else lora.dropout
    return targets, dropout
