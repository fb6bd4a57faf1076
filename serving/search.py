"""One search request end to end: a customer's index, a policy, the harness, a ranked answer.

Shared by `searchsmith search` and the HTTP search service so both answer identically.

`POLICY+rerank` runs POLICY, then rebuilds the final ranking by selection (`agent.selection`):
the customer's trained reranker scores what the episode surfaced, fused with the policy's own
order, exactly as the benchmark's `+rerank` candidates do, so a promoted `heuristic+rerank` is
served as it was measured. The policy's own ranking stays in the trajectory's metadata.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from agent.environment import open_harness
from agent.policy_spec import PolicySpec
from agent.selection import select
from agent.trajectory import RankedDocument, Trajectory
from evaluation.candidates import merge_nx
from search.index import HybridIndex
from search.reranker import Reranker


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


def run_search(index: HybridIndex, question: str, policy_spec: str | PolicySpec = "heuristic", k: int = 10, parallel: int = 1,
               seed: int = 0, profile_spec: str | PolicySpec | None = None, reranker: Reranker | None = None) -> SearchResponse:
    """`profile_spec`: the checkpoint whose harness profile to run under when `policy_spec` does not
    say it (a vLLM-served adapter is reached as `openai:URL#NAME`; its profile is in its sidecar).
    `reranker`: the customer's, required by a `POLICY+rerank` spec."""
    if not question.strip():
        raise ValueError("the question is empty")
    if k < 1 or parallel < 1:
        raise ValueError("k and parallel must be at least 1")
    requested = PolicySpec.of(policy_spec)
    rerank, policy_spec = requested.rerank, requested.without_selection().name
    if rerank and reranker is None:
        raise ValueError(f"policy {requested.name!r} selects with the customer's reranker, and the customer "
                         "has none yet: materialize reranker_checkpoint (searchsmith finetune CUSTOMER --stage reranker)")
    profile_spec = PolicySpec.of(profile_spec).without_selection() if profile_spec else None
    try:
        harness = open_harness(policy_spec, index, profile_spec=profile_spec, max_output_docs=k)
    except ValueError as error:  # the served policy cannot run here (e.g. a local model without torch)
        raise PolicyFailed(f"the search policy {policy_spec!r} could not be loaded: {error}") from error
    with harness:
        if parallel == 1:
            trajectories = [harness.run(question, seed=seed)]
            _raise_if_every_rollout_failed(policy_spec, trajectories)
            answer = trajectories[0]
        else:
            started = time.perf_counter()
            merged = harness.run_nx(question, parallel, seed=seed)
            _raise_if_every_rollout_failed(policy_spec, merged.trajectories)
            trajectories = merged.trajectories
            answer = merge_nx(policy_spec, question, None, seed, merged, time.perf_counter() - started)
    if rerank and answer.seen_doc_ids():
        answer.metadata = {**answer.metadata, "policy_ranking": [doc.doc_id for doc in answer.final_ranking]}
        answer.final_ranking = select(answer, question, index, reranker, k, policy=policy_spec)
    summary = trajectories[0].summary() if parallel == 1 else merged.summary()
    return SearchResponse(_documents(answer.final_ranking, index, k), summary, trajectories)


def _raise_if_every_rollout_failed(policy_spec: str, trajectories: list[Trajectory]) -> None:
    """Some of N rollouts failing still leaves an answer from the others; all failing leaves none."""
    failed = [t.error for t in trajectories if t.error]
    if trajectories and len(failed) == len(trajectories):
        raise PolicyFailed(f"the search policy {policy_spec!r} failed: {failed[0]}")

