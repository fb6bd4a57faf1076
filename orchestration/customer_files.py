"""Customer files validated whole when they are loaded, not section by section when a stage runs.

corpus/ validates what it owns (the top level, sources, chunking, limits) and keeps the stage
sections untyped, because it may not import the stages. This is the one place that knows every
stage's model: each section of a file is validated against it here, so `training.sft.max_lenght`
is an error naming the file and that path when the customer is added, listed or loaded by a
Dagster resource, not hours later when training starts (or never, for a key that a stage would
have ignored). Every registry orchestration builds goes through `customer_registry`.

The stages still validate their own section when they run (the same models), so code that loads
a customer without this check (tests, notebooks) gets the same errors later.
"""

from __future__ import annotations

import difflib
from functools import lru_cache
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter, ValidationError

from corpus.config import STAGE_SECTIONS, CustomerConfig, CustomerConfigError
from corpus.registry import CustomerRegistry, KnownCustomers

# Free-form dicts inside sections that are really HarnessConfig overrides: HarnessConfig ignores
# keys it does not know, so a typo there would silently leave the default in place.
HARNESS_OVERRIDES = (("benchmark", "harness"), ("training", "harness"), ("training", "rl", "harness"))


@lru_cache(maxsize=1)
def section_models() -> dict[str, Any]:
    """Each section's validator: the model its stage reads it with (imported on first use: the
    training stage pulls in torch)."""
    from evaluation.customer_report import BenchmarkSettings
    from serving.deployment import ServingSettings
    from synth.generate import TaskGenConfig
    from training.customer_training import TrainingSettings

    return {
        "tasks": TaskGenConfig,  # synth.stage.task_config: the file's `domain` unless the section sets one
        "benchmark": BenchmarkSettings,  # the benchmark_report asset
        "training": TrainingSettings,  # training.customer_training.training_settings
        "serving": ServingSettings,  # serving.deployment.serving_settings
        "demo_question": TypeAdapter(str | None),  # searchsmith demo
    }


def _known_keys(model: Any, loc: tuple) -> list[str]:
    """The keys allowed where `loc` points (for a "did you mean"), walking nested models."""
    current = model
    for part in loc[:-1]:
        field = getattr(current, "model_fields", {}).get(part) if isinstance(part, str) else None
        if field is None:
            return []
        nested = [t for t in (field.annotation, *get_args(field.annotation)) if isinstance(t, type) and issubclass(t, BaseModel)]
        if not nested:
            return []
        current = nested[0]
    return list(getattr(current, "model_fields", {}))


def _unknown(path: str, key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    return f"{path}: unknown key" + (f" (did you mean {close[0]!r}?)" if close else "")


def section_errors(config: CustomerConfig) -> list[str]:
    """`section.path.to.key: reason` for every problem in the stage sections; empty when valid."""
    models = section_models()
    missing = set(STAGE_SECTIONS) - set(models)
    if missing:  # a section corpus/ accepts that nothing here validates would slip through again
        raise RuntimeError(f"stage sections without a validator: {sorted(missing)}")
    extra = config.model_extra or {}
    raw = {"tasks": {"domain": config.domain, **config.tasks}, **{name: extra[name] for name in STAGE_SECTIONS if name in extra}}
    errors: list[str] = []
    for section, value in raw.items():
        model = models[section]
        if value is None and section != "demo_question":
            value = {}  # `training:` with nothing under it: the stage's defaults
        try:
            model.validate_python(value) if isinstance(model, TypeAdapter) else model.model_validate(value)
        except ValidationError as error:
            for item in error.errors(include_url=False):
                path = ".".join([section, *map(str, item["loc"])])
                if item["type"] == "extra_forbidden":
                    errors.append(_unknown(path, str(item["loc"][-1]), _known_keys(model, item["loc"])))
                else:
                    errors.append(f"{path}: {item['msg']}")
    errors += _harness_override_errors(raw)
    return errors


def _harness_override_errors(raw: dict[str, Any]) -> list[str]:
    from retrieval.harness import HarnessConfig

    known = [name for name in HarnessConfig.model_fields]
    errors = []
    for location in HARNESS_OVERRIDES:
        value: Any = raw
        for part in location:
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, dict):
            errors += [_unknown(".".join([*location, str(key)]), str(key), known) for key in value if key not in known]
    return errors


def check_stage_sections(config: CustomerConfig, path: Path) -> None:
    """A registry's `check`: raise CustomerConfigError naming the file and every bad key's path."""
    errors = section_errors(config)
    if errors:
        raise CustomerConfigError("\n".join([f"{path}: invalid customer file", *(f"  - {error}" for error in errors)]))


def customer_registry(home: Path | None = None, folder: Path | None = None) -> CustomerRegistry:
    """The registry every command, resource, sensor and the search service use: whole-file validation."""
    return CustomerRegistry(home=home, folder=folder, check=check_stage_sections)


def known_customers() -> KnownCustomers:
    return KnownCustomers(customer_registry())
