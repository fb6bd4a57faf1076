"""Policies behind one interface (`agent.policy_base.Policy`), chosen by a spec string.

Specs (the CLI's `--policy`): `heuristic` (the scripted teacher/baseline), `openai:URL#MODEL`
and `transformers:PATH`. The model-backed policies live in their own modules and are imported
only when asked for (torch and openai are heavy, and `heuristic` must work without them).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from agent.policy_base import Policy
from agent.policy_spec import PolicySpec

# Specs of policies backed by a model (their options bound generation; scripted policies take none).
MODEL_PREFIXES = ("transformers:", "openai:")
# spec prefix -> (module, factory function taking (spec_rest, **options))
_MODEL_POLICIES: dict[str, tuple[str, str]] = {
    "openai": ("agent.policies.openai_policy", "policy_from_spec"),
    "transformers": ("agent.policies.transformers_policy", "policy_from_spec"),
}
# What a policy needs installed beyond the base package, checked when it is loaded: a serving-only
# install has no torch, and a model that fails on its first reply fails far from its cause.
_REQUIRES: dict[str, tuple[tuple[str, ...], str]] = {
    "transformers": (("torch", "transformers"), "install searchsmith[train], or serve the adapter on vLLM "
                                                "(the customer file's serving.vllm_url) and search through it"),
}


def load_policy(spec: str | PolicySpec, **options: Any) -> Policy:
    """Build the policy named by `spec`; options go to its constructor."""
    spec = PolicySpec.of(spec).name
    if spec == "heuristic" or spec.startswith("heuristic:"):
        from agent.policies.heuristic import HeuristicPolicy

        return HeuristicPolicy(**options)
    prefix, _, rest = spec.partition(":")
    if prefix in _MODEL_POLICIES and rest:
        needed, remedy = _REQUIRES.get(prefix, ((), ""))
        missing = [name for name in needed if importlib.util.find_spec(name) is None]
        if missing:
            raise ValueError(f"policy {spec!r} runs the model in this process, which needs {', '.join(missing)} (not installed): {remedy}")
        module_name, factory = _MODEL_POLICIES[prefix]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            raise ValueError(f"policy {prefix!r} is not available in this installation ({module_name} missing)") from None
        return getattr(module, factory)(rest, **options)
    raise ValueError(f"unknown policy {spec!r}; use heuristic, openai:URL#MODEL or transformers:PATH")


__all__ = ["MODEL_PREFIXES", "checkpoint_options", "checkpoint_profile", "checkpoint_training", "harness_for", "load_policy"]


def checkpoint_profile(spec: str | PolicySpec) -> dict[str, Any] | None:
    """The harness profile a checkpoint was trained under (from its adapter's sidecar), or None
    for policies that have none (baselines, the heuristic, endpoints, plain model folders)."""
    adapter = PolicySpec.of(spec).adapter()
    if adapter is None or not adapter.readable:
        return None
    return adapter.sidecar().get("harness_profile") or None


def harness_for(spec: str | PolicySpec, **overrides: Any):
    """The `HarnessConfig` to run `spec` under: its checkpoint's profile when it has one (what it
    learned to work in), then `overrides` (the caller's k, a benchmark's turn cap)."""
    from agent.harness import HarnessConfig

    return HarnessConfig.from_profile(checkpoint_profile(spec), **overrides)


def checkpoint_options(spec: str | PolicySpec, config: Any, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Policy options for running `spec` under `config`: a checkpoint may write replies as long as
    its profile's reply reserve unless `options` cap them (other policies get `options` as given)."""
    options = dict(options or {})
    if checkpoint_profile(spec) is not None:
        options.setdefault("max_new_tokens", config.response_reserve_tokens)
    return options


# Below this many trained tokens a checkpoint is labelled a smoke-sized run wherever it is
# compared (about an hour of LoRA SFT of SmolLM2 on 2 CPU cores: bench/sft_bench.py).
SMOKE_SFT_TOKENS = 150_000
SMOKE_RL_STEPS = 20


def checkpoint_training(spec: str | PolicySpec) -> str | None:
    """How much training a checkpoint had, in words, for tables that compare it (None: not ours)."""
    if checkpoint_profile(spec) is None:
        return None
    sidecar = PolicySpec.of(spec).adapter().sidecar()
    if sidecar.get("kind") == "sft":
        metrics = sidecar.get("metrics") or {}
        tokens, steps = int(metrics.get("tokens") or 0), metrics.get("steps")
        smoke = tokens < SMOKE_SFT_TOKENS
        return f"{'smoke-sized run: ' if smoke else ''}SFT, {steps} steps, {tokens:,} tokens"
    steps = int(sidecar.get("step") or sidecar.get("total_steps") or 0)
    smoke = steps < SMOKE_RL_STEPS
    return f"{'smoke-sized run: ' if smoke else ''}CISPO, {steps} steps of {sidecar.get('config', {}).get('group_size', '?')} rollouts"
