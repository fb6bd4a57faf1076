"""The promotion gate: which benchmarked candidate, if any, replaces the served policy.

Input: the `benchmark_report` asset's summary, `{suite: {policy spec: metrics}}`, where suite
`test` is the customer's verified test split and every other suite an external benchmark file
(`{customer}/benchmark/summary.json`). The gate:

1. ranks the *eligible* candidates on the test split: answer found, ties by recall, then fewer
   mean prompt tokens (then the one already served, so equal numbers never churn the service);
2. promotes the best one when nothing is served yet (it is the best we have measured);
3. otherwise promotes the best-ranked candidate that beats the served policy on test answer
   found by at least `margin` AND regresses on no suite (test or external) by more than
   `tolerance` on any of `regression_metrics`. A candidate that wins the test split but loses an
   external suite is passed over, not a veto on the ones ranked below it: a checkpoint trained
   further on the synthetic tasks can gain on their test split and lose on real questions while
   its sibling gains on both (measured on the learning benchmark: `passed_over` lists them).

Eligibility: only what the search service can run as a policy. The single-shot baselines
(`bm25`, `dense`, `hybrid`) are yardsticks, not agents: they are in every report but could
never be served. `openai:URL#MODEL` is usually the teacher (a third party's endpoint) and is
left out by default; add `openai:*` to `eligible` to allow it. Nx variants (`SPEC@N`) are
excluded unless `allow_nx`, since the service runs one rollout per request. `POLICY+rerank`
(selection by the customer's reranker) is eligible when POLICY is: the service runs selection too.

The served policy's numbers come from the *current* report when it was benchmarked again (same
tasks, same index: a fair comparison), else from its record (the report it was promoted on);
the decision says which. Pure code: no Dagster, no I/O; `served_state` persists the outcome.
"""

from __future__ import annotations

import math
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field

from core.adapter_record import AdapterRecord
from core.serving_settings import PromotionSettings
from serving.served_state import ServedRecord, utc_now

KEY_METRICS = ("answer_found", "recall", "precision", "f1", "trajectory_recall", "prune_accuracy", "mean_prompt_tokens", "n")
_EPS = 1e-9  # rates are means of 0/1 scores: 0.71 - 0.70 must count as a 0.01 gain

Results = Mapping[str, Mapping[str, Mapping[str, Any]]]  # suite -> policy spec -> metrics


class RankedCandidate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    answer_found: float
    recall: float | None = None
    mean_prompt_tokens: float | None = None
    final_answers: float | None = None  # share of episodes with a parseable final answer
    n: int | None = None


class SuiteComparison(BaseModel):
    """One suite and metric: the candidate against the served policy."""

    model_config = ConfigDict(extra="forbid")

    suite: str
    metric: str
    candidate: float
    served: float
    delta: float  # candidate - served
    regressed: bool  # delta below -tolerance


DecisionStatus = Literal["first_promotion", "promoted", "already_served", "margin_not_met", "regression",
                         "no_served_numbers", "no_candidate"]


class PassedOver(BaseModel):
    """A candidate ranked above the decision's that met the margin and regressed on some suite."""

    model_config = ConfigDict(extra="forbid")

    name: str
    test_gain: float
    regressions: list[str]  # "suite/metric" beyond tolerance


class PromotionDecision(BaseModel):
    """What the gate decided and every number behind it (the asset's metadata, the CLI's output)."""

    model_config = ConfigDict(extra="forbid")

    promoted: bool
    status: DecisionStatus
    reason: str
    candidate: str | None = None
    candidate_metrics: dict[str, dict[str, float]] = Field(default_factory=dict)  # suite -> metric -> value
    served: str | None = None
    served_metrics: dict[str, dict[str, float]] = Field(default_factory=dict)
    served_metrics_source: Literal["report", "record"] | None = None
    test_gain: float | None = None  # candidate - served test answer found
    comparisons: list[SuiteComparison] = Field(default_factory=list)
    regressions: list[str] = Field(default_factory=list)  # "suite/metric" beyond tolerance
    ranking: list[RankedCandidate] = Field(default_factory=list)  # eligible candidates, best first
    passed_over: list[PassedOver] = Field(default_factory=list)  # better-ranked candidates that regressed
    ineligible: dict[str, str] = Field(default_factory=dict)  # spec -> why it was not considered
    settings: PromotionSettings = Field(default_factory=PromotionSettings)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return None if math.isnan(value) or math.isinf(value) else float(value)


def key_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The headline numbers of one summary (intervals, per-group means and costs left out)."""
    out = {}
    for key in KEY_METRICS:
        value = _number(metrics.get(key))
        if value is not None:
            out[key] = value
    return out


def metrics_by_suite(results: Results, policy: str) -> dict[str, dict[str, float]]:
    return {suite: key_metrics(policies[policy]) for suite, policies in results.items() if policy in policies}


def eligibility(spec: str, settings: PromotionSettings) -> str | None:
    """None when `spec` may be served, else why not."""
    from agent.policy_spec import PolicySpec

    parsed = PolicySpec.parse(spec)
    if parsed.is_baseline:
        return "single-shot retrieval baseline: a yardstick, not an agent policy the service can run"
    if parsed.n > 1 and not settings.allow_nx:
        return f"Nx variant ({parsed.n} rollouts per request); the service runs one (set allow_nx)"
    if not any(fnmatchcase(parsed.policy, pattern) for pattern in settings.eligible):
        return f"not matched by the eligible patterns {settings.eligible}"
    return None


def rank_candidates(test: Mapping[str, Mapping[str, Any]], settings: PromotionSettings,
                    served: str | None = None) -> tuple[list[RankedCandidate], dict[str, str]]:
    """Eligible candidates best first: answer found, recall, fewer prompt tokens, the served one, name."""
    ranked, ineligible = [], {}
    for name, metrics in test.items():
        why = eligibility(name, settings)
        answer_found = _number(metrics.get("answer_found"))
        if why is None and answer_found is None:
            why = "no answer-found figure on the test split"
        if why is not None:
            ineligible[name] = why
            continue
        n = _number(metrics.get("n"))
        ranked.append(RankedCandidate(name=name, answer_found=answer_found, recall=_number(metrics.get("recall")),
                                      mean_prompt_tokens=_number(metrics.get("mean_prompt_tokens")),
                                      final_answers=_number(metrics.get("final_answers")),
                                      n=int(n) if n is not None else None))

    def order(c: RankedCandidate) -> tuple:
        recall = c.recall if c.recall is not None else -math.inf
        tokens = c.mean_prompt_tokens if c.mean_prompt_tokens is not None else math.inf
        return (-c.answer_found, -recall, tokens, c.name != served, c.name)

    return sorted(ranked, key=order), ineligible


def compare_suites(candidate: dict[str, dict[str, float]], served: dict[str, dict[str, float]],
                   settings: PromotionSettings) -> list[SuiteComparison]:
    """Every suite and regression metric with numbers for both; a suite only one side has is skipped."""
    comparisons = []
    for suite in sorted(set(candidate) & set(served)):
        for metric in settings.regression_metrics:
            ours, theirs = candidate[suite].get(metric), served[suite].get(metric)
            if ours is None or theirs is None:
                continue
            delta = ours - theirs
            comparisons.append(SuiteComparison(suite=suite, metric=metric, candidate=ours, served=theirs, delta=delta,
                                               regressed=delta < -settings.tolerance - _EPS))
    return comparisons


def _describe(c: RankedCandidate) -> str:
    parts = [f"answer found {c.answer_found:.3f}"]
    if c.recall is not None:
        parts.append(f"recall {c.recall:.3f}")
    if c.mean_prompt_tokens is not None:
        parts.append(f"{c.mean_prompt_tokens:,.0f} prompt tokens")
    return ", ".join(parts)


def decide(results: Results, served: ServedRecord | None, settings: PromotionSettings | None = None) -> PromotionDecision:
    """The gate's decision for one customer's benchmark results (see the module docstring)."""
    settings = settings or PromotionSettings()
    if settings.test_suite not in results:
        raise ValueError(f"benchmark results have no {settings.test_suite!r} suite (have: {sorted(results)}); "
                         "the gate ranks candidates on the customer's verified test split")
    suite = settings.test_suite
    ranking, ineligible = rank_candidates(results[suite], settings, served.policy if served else None)
    common = {"ranking": ranking, "ineligible": ineligible, "settings": settings, "served": served.policy if served else None}
    if not ranking:
        return PromotionDecision(promoted=False, status="no_candidate", **common,
                                 reason=f"no eligible candidate on the {suite} split (considered: {sorted(ineligible) or 'none'}); "
                                        + ("the served policy stays" if served else "nothing is served; the heuristic fallback stays"))
    best = ranking[0]
    candidate_metrics = metrics_by_suite(results, best.name)
    common.update(candidate=best.name, candidate_metrics=candidate_metrics)
    if served is None:
        return PromotionDecision(
            promoted=True, status="first_promotion", **common,
            reason=f"nothing is served yet: {best.name} is the best of {len(ranking)} eligible candidate(s) on the "
                   f"{suite} split ({_describe(best)})")

    fresh = metrics_by_suite(results, served.policy)
    source: Literal["report", "record"] = "report" if suite in fresh else "record"
    served_metrics = fresh if source == "report" else {**served.metrics, **fresh}
    common.update(served_metrics=served_metrics, served_metrics_source=source)
    if best.name == served.policy:
        return PromotionDecision(promoted=False, status="already_served", **common,
                                 reason=f"{best.name} is already served and is still the best eligible candidate "
                                        f"on the {suite} split ({_describe(best)})")
    theirs = served_metrics.get(suite, {}).get("answer_found")
    if theirs is None:
        return PromotionDecision(promoted=False, status="no_served_numbers", **common,
                                 reason=f"kept {served.policy}: it has no {suite} answer-found figure in this report or "
                                        f"its record, so {best.name} cannot be compared; add it to the benchmark's policies")
    passed_over: list[PassedOver] = []
    blocked: PromotionDecision | None = None
    for candidate in ranking:
        if candidate.name == served.policy:
            break  # ranked by answer found: nothing below the served policy beats it
        gain = candidate.answer_found - theirs
        if gain + _EPS < settings.margin or gain <= 0:
            break  # nor by the margin, below a candidate that does not
        decision = _judge(candidate, gain, results, served, served_metrics, source, settings, common)
        if decision.promoted:
            return decision.model_copy(update={"passed_over": passed_over, "reason": decision.reason + _passed_over_note(passed_over)})
        blocked = blocked or decision
        passed_over.append(PassedOver(name=candidate.name, test_gain=gain, regressions=decision.regressions))
    if blocked is not None:
        also = passed_over[1:]
        return blocked.model_copy(update={"passed_over": also, "reason": blocked.reason + _passed_over_note(also, "also regressing")})
    gain = best.answer_found - theirs
    comparisons = compare_suites(candidate_metrics, served_metrics, settings)
    return PromotionDecision(promoted=False, status="margin_not_met", test_gain=gain, comparisons=comparisons,
                             regressions=[f"{c.suite}/{c.metric}" for c in comparisons if c.regressed], **common,
                             reason=f"kept {served.policy}: {best.name} reaches {best.answer_found:.3f} vs {theirs:.3f} "
                                    f"answer found on the {suite} split ({gain:+.3f}), short of the {settings.margin:.3f} margin")


def _judge(candidate: RankedCandidate, gain: float, results: Results, served: ServedRecord,
           served_metrics: dict[str, dict[str, float]], source: str, settings: PromotionSettings,
           common: dict[str, Any]) -> PromotionDecision:
    """One candidate that meets the margin: promoted unless some suite regresses beyond tolerance."""
    suite = settings.test_suite
    candidate_metrics = metrics_by_suite(results, candidate.name)
    comparisons = compare_suites(candidate_metrics, served_metrics, settings)
    regressions = [f"{c.suite}/{c.metric}" for c in comparisons if c.regressed]
    fields = {**common, "candidate": candidate.name, "candidate_metrics": candidate_metrics, "test_gain": gain,
              "comparisons": comparisons, "regressions": regressions}
    theirs = served_metrics[suite]["answer_found"]
    numbers = f"{candidate.answer_found:.3f} vs {theirs:.3f} answer found on the {suite} split ({gain:+.3f}"
    if regressions:
        worst = ", ".join(f"{c.suite} {c.metric} {c.candidate:.3f} vs {c.served:.3f} ({c.delta:+.3f})"
                          for c in comparisons if c.regressed)
        return PromotionDecision(promoted=False, status="regression", **fields,
                                 reason=f"kept {served.policy}: {candidate.name} beats it with {numbers}) but regresses beyond "
                                        f"the {settings.tolerance:.3f} tolerance on {worst}")
    checked = sorted({c.suite for c in comparisons})
    return PromotionDecision(promoted=True, status="promoted", **fields,
                             reason=f"{candidate.name} replaces {served.policy}: {numbers}, margin {settings.margin:.3f}); "
                                    f"no regression beyond {settings.tolerance:.3f} on {', '.join(checked)} "
                                    f"(served numbers from the {'current report' if source == 'report' else 'served record'})")


def _passed_over_note(passed_over: list[PassedOver], label: str = "passed over, ranked higher but regressing") -> str:
    if not passed_over:
        return ""
    names = "; ".join(f"{p.name} ({p.test_gain:+.3f} on test, regressed on {', '.join(p.regressions)})" for p in passed_over)
    return f"; {label}: {names}"


def decision_table(decision: PromotionDecision) -> str:
    """The gate's table (Markdown): every eligible candidate with its numbers and, for our own
    checkpoints, how much training they had (a smoke-sized run says so, so it is not read as a result)."""
    from agent.policies import checkpoint_training

    lines = ["| candidate | answer found | recall | final answers | prompt tokens | n | training |",
             "|---|---|---|---|---|---|---|"]
    for c in decision.ranking:
        recall = "-" if c.recall is None else f"{c.recall:.3f}"
        answered = "-" if c.final_answers is None else f"{c.final_answers:.2f}"
        tokens = "-" if c.mean_prompt_tokens is None else f"{c.mean_prompt_tokens:,.0f}"
        training = checkpoint_training(c.name) or "-"
        lines.append(f"| {c.name} | {c.answer_found:.3f} | {recall} | {answered} | {tokens} | {c.n or '-'} | {training} |")
    if decision.comparisons:
        lines += ["", "| suite | metric | candidate | served | delta | regressed |", "|---|---|---|---|---|---|"]
        lines += [f"| {c.suite} | {c.metric} | {c.candidate:.3f} | {c.served:.3f} | {c.delta:+.3f} | {'yes' if c.regressed else ''} |"
                  for c in decision.comparisons]
    return "\n".join(lines)


def adapter_of(spec: str) -> tuple[str | None, str | None]:
    """(adapter_path, base_model) of a policy spec; (None, None) for policies without weights.

    `transformers:ADAPTER_DIR` reads the base from the adapter's sidecar (or peft's config),
    `transformers:BASE+ADAPTER` names both, `transformers:MODEL` (a folder with config.json, or
    `smollm2`) is a full model. A path that cannot be read here is taken for an adapter folder
    with an unknown base (pass `base_model` to `record_for`). `+rerank` selects; the weights
    are the policy's.
    """
    from agent.policy_spec import PolicySpec

    parsed = PolicySpec.parse(spec)
    adapter = parsed.adapter()
    if adapter is not None:
        return adapter.folder, adapter.base_model
    prefix, _, rest = parsed.policy.partition(":")
    return None, (rest if prefix == "transformers" and rest else None)


def record_for(customer: str, decision: PromotionDecision, base_model: str | None = None,
               published: Iterable[AdapterRecord] = ()) -> ServedRecord:
    """The `ServedRecord` to persist for a promoting decision; `base_model` overrides the one read from the adapter.

    `published` are the customer's checkpoint records (`training.per_customer.checkpoint_adapters`):
    the candidate's adapter is looked up among them by folder, so the served record keeps the
    artifact-store key a serving machine pulls the weights from."""
    if not decision.promoted or decision.candidate is None:
        raise ValueError(f"decision did not promote anything ({decision.status}): {decision.reason}")
    adapter_path, found_base = adapter_of(decision.candidate)
    adapter = None
    if adapter_path is not None:
        by_folder = {_folder_identity(record.path): record for record in published}
        known = by_folder.get(_folder_identity(adapter_path))
        adapter = AdapterRecord(path=adapter_path, store_key=known.store_key if known else None,
                                base_model=base_model or found_base or (known.base_model if known else None))
    return ServedRecord(customer=customer, policy=decision.candidate, adapter=adapter, metrics=decision.candidate_metrics,
                        promoted_at=utc_now(), reason=decision.reason)


def _folder_identity(path: str) -> str:
    return str(Path(path).expanduser().resolve())
