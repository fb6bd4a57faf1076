"""The one way to run a named policy over a backend: the harness under the policy's own profile.

Why one entry point: a checkpoint must run under the harness profile it was trained in (its
sidecar's budget, view and reply reserve), with the caller's settings (a benchmark's `k` and turn
cap, a request's `k`) on top, and may write replies as long as that profile's reserve. The
benchmark's candidates and the search service (CLI and HTTP) open their harness here by spec, so
a policy is measured under exactly the settings it is served under; the teacher's rollouts, RL's
rollouts, the student-view replay and the selection calibration open theirs here with the policy
object and training profile they own.
"""

from __future__ import annotations

from typing import Any

from agent.harness import Harness, HarnessConfig
from agent.policies import MODEL_PREFIXES, checkpoint_options, harness_for, load_policy
from agent.policy_base import Policy
from agent.policy_spec import PolicySpec
from search.backend import SearchBackend


def open_harness(spec: str | PolicySpec | Policy, backend: SearchBackend, *, profile_spec: str | PolicySpec | None = None,
                 model_options: dict[str, Any] | None = None, config: HarnessConfig | None = None,
                 **overrides: Any) -> Harness:
    """A harness running `spec` over `backend`.

    `spec` is a policy spec (evaluation, the search service) or a policy object that was built
    elsewhere (the teacher from a customer's `teacher:` section, the policy being trained in RL);
    an object runs under `config` (the training profile its caller owns), with `overrides` on top.
    `profile_spec`: the checkpoint whose profile to use when `spec` does not carry one (a
    vLLM-served adapter is reached as `openai:URL#NAME`; its profile is in its sidecar).
    `model_options` (e.g. `max_new_tokens`) go to model-backed policies only: they bound what a
    model may cost without changing the scripted ones. `overrides` are harness settings."""
    if not isinstance(spec, (str, PolicySpec)):
        base = config or HarnessConfig()
        return Harness(backend, spec, HarnessConfig(**{**base.model_dump(), **overrides}) if overrides else base)
    spec = PolicySpec.of(spec)
    config = harness_for(profile_spec or spec, **overrides)
    options = dict(model_options or {}) if spec.policy.startswith(MODEL_PREFIXES) else {}
    return Harness(backend, load_policy(spec, **checkpoint_options(spec, config, options)), config)
