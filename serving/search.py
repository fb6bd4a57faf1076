"""One search request end to end: a customer's index, a policy, the harness, a ranked answer.

Shared by `searchsmith search` and the HTTP search service so both answer identically.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.harness import Harness
from agent.policies import checkpoint_options, harness_for, load_policy
from agent.trajectory import RankedDocument, Trajectory
from search.index import HybridIndex


class PolicyFailed(RuntimeError):
    """Every rollout of the search ended on a policy error (an unreachable or failing model
    endpoint): there is no answer, which is not the same as an empty one."""


@dataclass
class SearchResponse:
    documents: list[dict[str, Any]]
    summary: dict[str, int]
    trajectories: list[Trajectory] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"documents": self.documents, "summary": self.summary}


def _documents(ranking: list[RankedDocument], index: HybridIndex, k: int) -> list[dict[str, Any]]:
    documents = []
    for doc in ranking[:k]:
        title = doc.title or index.document_title(doc.doc_id) or ""
        chunk_id = doc.chunk_id
        if chunk_id is None:
            chunks = index.document_chunks(doc.doc_id)
            chunk_id = chunks[0].chunk_id if chunks else None
        documents.append({"doc_id": doc.doc_id, "chunk_id": chunk_id, "title": title, "justification": doc.justification})
    return documents


def run_search(index: HybridIndex, question: str, policy_spec: str = "heuristic", k: int = 10, parallel: int = 1, seed: int = 0,
               profile_spec: str | None = None) -> SearchResponse:
    """`profile_spec`: the checkpoint whose harness profile to run under when `policy_spec` does not
    say it (a vLLM-served adapter is reached as `openai:URL#NAME`; its profile is in its sidecar)."""
    if not question.strip():
        raise ValueError("the question is empty")
    if k < 1 or parallel < 1:
        raise ValueError("k and parallel must be at least 1")
    config = harness_for(profile_spec or policy_spec, max_output_docs=k)  # a checkpoint answers under its own profile
    policy = load_policy(policy_spec, **checkpoint_options(policy_spec, config))
    with Harness(index, policy, config) as harness:
        if parallel == 1:
            trajectory = harness.run(question, seed=seed)
            _raise_if_every_rollout_failed(policy_spec, [trajectory])
            return SearchResponse(_documents(trajectory.final_ranking, index, k), trajectory.summary(), [trajectory])
        merged = harness.run_nx(question, parallel, seed=seed)
        _raise_if_every_rollout_failed(policy_spec, merged.trajectories)
        return SearchResponse(_documents(merged.ranking, index, k), merged.summary(), merged.trajectories)


def _raise_if_every_rollout_failed(policy_spec: str, trajectories: list[Trajectory]) -> None:
    """Some of N rollouts failing still leaves an answer from the others; all failing leaves none."""
    failed = [t.error for t in trajectories if t.error]
    if trajectories and len(failed) == len(trajectories):
        raise PolicyFailed(f"the search policy {policy_spec!r} failed: {failed[0]}")

