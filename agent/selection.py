"""Selection: the final ranking rebuilt from everything an episode surfaced, judged by a reranker.

Why: an agent sees far more than it returns. On real multi-hop questions the heuristic agent
has a supporting document somewhere in its trajectory for 96% of what it needs but returns 82%
of them in its top 5; the loss is between finding and ranking. Selection takes every document
the episode's tool calls returned (not only the ones the policy listed), scores each by its
best chunk the episode saw with the customer's reranker (`search.reranker`), and fuses that order with the policy's own by
reciprocal rank, so a document both the policy and the reranker like comes first and one the
policy found but did not list can still make the cut.

The policy's order is its final ranking followed by the other surfaced documents in the order
they first appeared. The reranker only reorders what was surfaced: it never adds a document.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agent.policy_spec import PolicySpec
from agent.trajectory import RankedDocument, Trajectory
from search.backend import SearchBackend
from search.reranker import Reranker, pair_text


@dataclass(frozen=True)
class SelectionSettings:
    """`rrf_k` flattens (large) or sharpens (small) both orders; `policy_weight` 0 is the
    reranker's order alone."""

    rrf_k: float = 10.0
    policy_weight: float = 1.0
    max_candidates: int = 40  # surfaced documents judged per episode (policy order first)
    chain_anchors: int = 0  # judge by two-document chains from this many first links (`Reranker.chain_order`); 0: by the question


# The kinds of candidate selection is calibrated for (`training.selection_weight`): an agent (the
# heuristic stands for every agent policy, models included) and a single-shot list (hybrid stands
# for bm25 and dense too).
AGENT_POLICY = "heuristic"
SINGLE_SHOT_POLICY = "hybrid"
CALIBRATED_POLICIES = (AGENT_POLICY, SINGLE_SHOT_POLICY)


def calibrated_as(policy: str | None) -> str:
    """The calibrated kind whose choice `policy` (a spec, `+rerank` or not) selects with."""
    if policy and PolicySpec.of(policy).without_selection().is_baseline:
        return SINGLE_SHOT_POLICY
    return AGENT_POLICY


def settings_for(reranker: Reranker, policy: str | None = None) -> SelectionSettings:
    """Selection as chosen for this reranker on its customer's dev split (weight, chains), for
    the kind of candidate `policy` is; a reranker calibrated before per-kind choices has one
    choice for every kind."""
    weight, chains = reranker.choice_for(calibrated_as(policy))
    return SelectionSettings(policy_weight=weight, chain_anchors=chains)


def judge(reranker: Reranker, question: str, candidates: Sequence[tuple[str, list[str]]], chain_anchors: int) -> list[tuple[str, float]]:
    """The reranker's order of the surfaced documents, best first with scores: by the question, or
    by the chains through them (`chain_anchors` > 0)."""
    if chain_anchors:
        return reranker.chain_order(question, candidates, chain_anchors)
    return reranker.order(question, candidates)


def policy_order(trajectory: Trajectory) -> list[str]:
    """The policy's ranking, then every other surfaced document by first appearance."""
    order = list(dict.fromkeys(trajectory.output_doc_ids()))
    listed = set(order)
    order += [doc for doc in dict.fromkeys(trajectory.seen_doc_ids()) if doc not in listed]
    return order


def surfaced_texts(trajectory: Trajectory, backend: SearchBackend, doc_ids: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Each document with the texts of its chunks the episode saw (all its chunks when the
    episode only saw its id, e.g. a document named in the answer from an earlier read)."""
    seen = set(trajectory.seen_chunk_ids())
    candidates = []
    for doc_id in doc_ids:
        chunks = backend.document_chunks(doc_id)
        texts = [hit.text for hit in chunks if hit.chunk_id in seen] or [hit.text for hit in chunks[:2]]
        title = backend.document_title(doc_id) or ""
        texts = [pair_text(title, text) for text in texts]
        if texts:
            candidates.append((doc_id, texts))
    return candidates


def fuse(policy: Sequence[str], judged: Sequence[str], settings: SelectionSettings) -> list[str]:
    """Reciprocal-rank fusion of the two orders over the documents in `judged`."""
    position = {doc: rank for rank, doc in enumerate(policy, start=1)}
    scores = {
        doc: 1.0 / (settings.rrf_k + rank) + settings.policy_weight / (settings.rrf_k + position.get(doc, len(policy) + 1))
        for rank, doc in enumerate(judged, start=1)
    }
    return sorted(scores, key=lambda doc: (-scores[doc], position.get(doc, len(policy) + 1)))


def select(trajectory: Trajectory, question: str, backend: SearchBackend, reranker: Reranker, k: int,
           settings: SelectionSettings | None = None, policy: str | None = None) -> list[RankedDocument]:
    """The top `k` of the fused order, as a final ranking (the policy's justification kept).
    `settings`: by default the reranker's own calibrated choice for `policy`'s kind (`settings_for`)."""
    settings = settings or settings_for(reranker, policy)
    order = policy_order(trajectory)[: settings.max_candidates]
    judged = judge(reranker, question, surfaced_texts(trajectory, backend, order), settings.chain_anchors)
    fused = fuse(order, [doc for doc, _ in judged], settings)[:k]
    previous = {doc.doc_id: doc for doc in trajectory.final_ranking}
    score = dict(judged)
    how = "chain score" if settings.chain_anchors else "reranker score"
    return [
        previous[doc].model_copy() if doc in previous else RankedDocument(
            doc_id=doc, title=backend.document_title(doc) or "", justification=f"selected: {how} {score[doc]:.3f}")
        for doc in fused
    ]
