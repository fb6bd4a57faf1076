"""Candidate specs -> runnable candidates: `bm25`, `dense`, `hybrid`, any policy spec
(`heuristic`, `openai:URL#MODEL`, `transformers:PATH`), `SPEC@N` for Nx mode, and `SPEC+rerank`
for any of them with selection by a reranker (`agent.selection`).

Why one runnable shape (`run(question, task_id, seed) -> Trajectory`): the runner, the scorer
and the trajectory files then treat a baseline, a 1x agent and an Nx agent identically. An Nx
run is recorded as ONE trajectory holding every rollout's turns (so trajectory recall is over
everything any rollout saw, and turns and tokens are totals: what Nx costs) with the RRF-merged
ranking as its final answer; the rollout ids are in `metadata`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from collections.abc import Sequence
from typing import Any, Protocol

from agent.policy_spec import PolicySpec
from agent.selection import SelectionSettings, select, settings_for
from agent.trajectory import Trajectory
from evaluation.baselines import SingleShotBaseline
from search.backend import SearchBackend
from search.reranker import Reranker

# Documents a single-shot baseline hands to the reranker: its top documents at this depth.
RERANK_BASELINE_DOCS = 20


class Runnable(Protocol):
    name: str

    def run(self, question: str, task_id: str | None = None, seed: int = 0) -> Trajectory: ...

    def describe(self) -> dict[str, Any]: ...


def split_candidates(text: str | Sequence[str | PolicySpec]) -> list[PolicySpec]:
    """A comma-separated list (the CLI's), or a list of specs or their string forms; duplicates are
    an error (report keys clash)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    specs = [PolicySpec.of(item) for item in items if not isinstance(item, str) or item.strip()]
    names = [spec.name for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"candidates listed twice: {duplicates}")
    if not specs:
        raise ValueError("no candidates given")
    return specs


@dataclass
class AgentCandidate:
    """The harness with one policy, 1x or Nx (rankings merged by RRF), output size `k`."""

    name: str
    harness: Any  # agent.harness.Harness
    n: int = 1
    spec: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "agent", "policy": self.spec or self.harness.policy.name, "policy_name": self.harness.policy.name,
            "n": self.n, "harness": self.harness.config.model_dump(), **self.extra,
        }

    def run(self, question: str, task_id: str | None = None, seed: int = 0) -> Trajectory:
        if self.n == 1:
            trajectory = self.harness.run(question, seed=seed, task_id=task_id)
            trajectory.policy = self.name
            return trajectory
        started = time.perf_counter()
        result = self.harness.run_nx(question, self.n, seed=seed, task_id=task_id)
        return merge_nx(self.name, question, task_id, seed, result, time.perf_counter() - started)


def merge_nx(name: str, question: str, task_id: str | None, seed: int, result: Any, wall_s: float) -> Trajectory:
    """One trajectory for an Nx result: all rollouts' turns, the merged ranking, summed costs."""
    rollouts: list[Trajectory] = result.trajectories
    turns = [turn for rollout in rollouts for turn in rollout.turns]
    chunk_docs: dict[str, str] = {}
    for rollout in rollouts:
        chunk_docs.update(rollout.chunk_docs)
    errors = [r.error for r in rollouts if r.error]
    return Trajectory(
        question=question, policy=name, seed=seed, task_id=task_id,
        config={**(rollouts[0].config if rollouts else {}), "nx": len(rollouts)},
        tools=rollouts[0].tools if rollouts else [], turns=turns, final_ranking=list(result.ranking),
        parse_errors=[e for r in rollouts for e in r.parse_errors],
        error="; ".join(errors) if errors and len(errors) == len(rollouts) else None,
        stop_reason="nx:" + ",".join(r.stop_reason for r in rollouts),
        wall_s=wall_s, peak_tokens=max((r.peak_tokens for r in rollouts), default=0),
        total_prompt_tokens=sum(r.total_prompt_tokens for r in rollouts), chunk_docs=chunk_docs,
        # Each rollout's own answer, so what the merge kept or lost can be measured (bench/nx_ceiling.py).
        metadata={"rollout_ids": [r.id for r in rollouts], "rollout_errors": errors, "rrf_scores": dict(result.scores),
                  "rollout_rankings": [r.output_doc_ids() for r in rollouts]},
    )


@dataclass
class SelectedCandidate:
    """A candidate whose final ranking is rebuilt by selection over what it surfaced; the
    candidate's own ranking is kept in the trajectory's metadata."""

    name: str
    inner: Any  # a Runnable
    backend: SearchBackend
    reranker: Reranker
    k: int
    settings: SelectionSettings | None = None  # None: the reranker's calibrated choice for this kind (agent.selection.settings_for)

    @property
    def harness(self) -> Any:
        return getattr(self.inner, "harness", None)

    def describe(self) -> dict[str, Any]:
        settings = self.settings or settings_for(self.reranker, self.name)
        return {**self.inner.describe(), "selection": {"reranker": str(self.reranker.path), **asdict(settings)}}

    def run(self, question: str, task_id: str | None = None, seed: int = 0) -> Trajectory:
        trajectory = self.inner.run(question, task_id=task_id, seed=seed)
        own = [doc.doc_id for doc in trajectory.final_ranking]
        if trajectory.seen_doc_ids():
            trajectory.final_ranking = select(trajectory, question, self.backend, self.reranker, self.k, self.settings, policy=self.name)
        trajectory.policy = self.name
        trajectory.metadata = {**trajectory.metadata, "policy_ranking": own}
        return trajectory


def build_candidate(spec: PolicySpec, backend: SearchBackend, k: int, harness_overrides: dict[str, Any] | None = None,
                    model_options: dict[str, Any] | None = None, reranker: Reranker | None = None) -> Runnable:
    """A runnable candidate; agents are told `k` as their maximum output size.

    A checkpoint runs under the harness profile it was trained in (its sidecar's), with the
    benchmark's `k` and overrides on top, and may write replies as long as the profile's reply
    reserve unless `model_options` caps them. `+rerank` candidates need `reranker`.
    """
    if spec.rerank:
        if reranker is None:
            raise ValueError(f"{spec.name}: a +rerank candidate needs a reranker (searchsmith bench --reranker DIR, "
                             "or a customer's reranker_checkpoint)")
        depth = max(k, RERANK_BASELINE_DOCS) if spec.is_baseline else k
        inner = build_candidate(spec.without_selection(), backend, depth, harness_overrides, model_options)
        return SelectedCandidate(spec.name, inner, backend, reranker, k)
    if spec.is_baseline:
        return SingleShotBaseline(backend, spec.policy, k)
    from agent.environment import open_harness

    harness = open_harness(spec.policy, backend, model_options=model_options, **{"max_output_docs": k, **(harness_overrides or {})})
    return AgentCandidate(name=spec.name, harness=harness, n=spec.n, spec=spec.policy)
