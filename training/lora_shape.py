"""The LoRA adapter's shape for a given base model: which modules or fused parameters it targets.

The customer file's `training.lora` says what the customer asked for (`core.training_settings`);
the base model's family (`agent.policies.model_family`) says what its weights allow.
"""

from __future__ import annotations

from core.training_settings import LoraSettings


def lora_shape(lora: LoraSettings, profile: object | None) -> tuple[list[str], float]:
    """(target names, dropout) of the adapter for a base model with `profile`
    (`agent.policies.model_family.BaseModelProfile`, None when the folder is not here).

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
