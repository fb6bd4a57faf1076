"""The agent harness's settings, and the overrides a customer file may give them.

Why here and not beside the harness: the customer file (`core.config`) carries harness
overrides in three places (`benchmark.harness`, `training.harness`, `training.rl.harness`) and
must refuse a misspelled one when the file is loaded; the harness (`agent.harness`)
extends these settings with what running them needs. A snapshot is stored in every trajectory.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_serializer, model_validator
from pydantic.fields import FieldInfo


class HarnessSettings(BaseModel):
    """Episode settings: the token budget and its thresholds, per-call budgets, the view, turn caps."""

    view: Literal["full", "compact"] = "full"  # compact: [n] references and short chunks, for small models
    token_budget: int = Field(32_768, gt=0)
    soft_threshold: float = Field(0.5, gt=0.0, lt=1.0)  # fraction of the budget
    soft_hint: bool = False  # on for training rollouts and for a checkpoint trained with it (its profile)
    hard_cutoff: float = 0.85  # fraction of the budget in [0.5, 1.0]
    search_budget_tokens: int = Field(2_048, gt=0)  # per search call: T/S = 16 full searches
    search_candidates: int = Field(50, gt=0)  # fused candidates fetched before dedup and cuts
    grep_limit: int = Field(5, gt=0)
    max_pattern_chars: int = Field(256, gt=0)
    response_reserve_tokens: int = Field(1_024, ge=0)  # kept free for the model's next reply
    max_turns: int = Field(32, gt=0)
    max_output_docs: int = Field(10, gt=0)
    parallel_tool_workers: int = Field(8, gt=0)
    max_malformed_replies: int = Field(2, ge=0)  # consecutive unparseable replies before giving up
    # The forced final answer's reply starts with the view's answer opening (`[` compact,
    # `<Document id=` full) for policies that render their own prompt, so a model asked to answer
    # with no tools offered cannot spend the turn on tool calls; off reproduces the older harness.
    prefill_final_answer: bool = True
    raise_policy_errors: bool = False
    raise_tool_errors: bool = False
    record_view_messages: bool = True

    @model_validator(mode="after")
    def _check(self) -> HarnessSettings:
        if not 0.5 <= self.hard_cutoff <= 1.0:
            raise ValueError(f"hard_cutoff must be within [0.5, 1.0] of the budget, got {self.hard_cutoff}")
        if self.soft_threshold > self.hard_cutoff:
            raise ValueError("soft_threshold must not be past the hard cutoff")
        if self.response_reserve_tokens >= self.token_budget:
            raise ValueError("response_reserve_tokens must be smaller than token_budget")
        return self


class _Overrides(BaseModel):
    """Some of `HarnessSettings`, as a customer file gives them: a misspelled key is an error
    naming the closest field, each value is checked against its field. It reads as a mapping of
    the keys that were set (`HarnessConfig(**overrides)`, `{**a, **b}`) and dumps as that
    mapping, so sidecars record what was written, not the defaults; whether the whole budget is
    consistent is checked when the overrides are applied to a config."""

    model_config = ConfigDict(extra="forbid")

    def keys(self) -> list[str]:
        return [name for name in type(self).model_fields if name in self.model_fields_set]

    def __getitem__(self, key: str) -> Any:
        if key not in self.model_fields_set:
            raise KeyError(key)
        return getattr(self, key)

    def __len__(self) -> int:
        return len(self.model_fields_set)

    def __bool__(self) -> bool:
        return bool(self.model_fields_set)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Overrides):
            other = dict(other)
        return dict(self) == other if isinstance(other, dict) else NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable, like the dict it stands for)

    def __repr_args__(self):
        return [(name, self[name]) for name in self.keys()]

    @model_serializer(mode="plain")
    def _as_set(self) -> dict[str, Any]:
        return {name: self[name] for name in self.keys()}


# The fields of HarnessSettings, with their defaults (a key not given stays unset): one definition
# of every name, type and bound.
HarnessOverrides = create_model(
    "HarnessOverrides", __base__=_Overrides, __module__=__name__,
    **{name: (field.annotation, FieldInfo.merge_field_infos(field)) for name, field in HarnessSettings.model_fields.items()},
)
HarnessOverrides.__doc__ = _Overrides.__doc__
