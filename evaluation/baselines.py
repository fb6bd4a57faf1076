"""Single-shot top-k baselines: one query (the question) to one retrieval leg, no agent.

Why these three: they bound what the agent adds. `bm25` and `dense` are the two legs alone,
`hybrid` is their RRF fusion (what `search_corpus` returns on its first call); an agent that
does not beat `hybrid` at the same output size is not earning its tokens.

Documents, not chunks, are the output unit: chunks are taken best first, each new document
is kept at its best chunk, until `k` distinct documents. The result is recorded as a one-turn
`Trajectory` (one search call; seen = returned) so the scorer treats baselines and agents the
same way; baselines use no model, so their prompt tokens are 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from agent.policy_spec import BASELINES
from agent.trajectory import RankedDocument, ToolCallRecord, Trajectory, Turn
from search.backend import Hit, SearchBackend

CANDIDATE_DEPTH = 50  # chunks fetched before deduplicating documents (the fusion depth)


def top_documents(hits: list[Hit], k: int) -> list[Hit]:
    """The best chunk of each of the first `k` distinct documents, in rank order."""
    chosen: dict[str, Hit] = {}
    for hit in hits:
        if hit.doc_id not in chosen:
            chosen[hit.doc_id] = hit
            if len(chosen) >= k:
                break
    return list(chosen.values())


@dataclass
class SingleShotBaseline:
    """`bm25` | `dense` | `hybrid` top-k documents for the question as the query."""

    backend: SearchBackend
    leg: str
    k: int
    depth: int = CANDIDATE_DEPTH

    def __post_init__(self) -> None:
        if self.leg not in BASELINES:
            raise ValueError(f"unknown baseline {self.leg!r} ({' | '.join(BASELINES)})")

    @property
    def name(self) -> str:
        return self.leg

    def describe(self) -> dict[str, Any]:
        return {"kind": "baseline", "leg": self.leg, "query": "the question", "depth": max(self.depth, self.k)}

    def _search(self, question: str) -> list[Hit]:
        depth = max(self.depth, self.k)
        if self.leg == "bm25":
            return self.backend.search_bm25(question, k=depth)
        if self.leg == "dense":
            return self.backend.search_dense(question, k=depth)
        return self.backend.search(question, k=depth)

    def run(self, question: str, task_id: str | None = None, seed: int = 0) -> Trajectory:
        started = time.perf_counter()
        hits = self._search(question)
        backend_ms = (time.perf_counter() - started) * 1000
        chosen = top_documents(hits, self.k)
        call = ToolCallRecord(
            id="call_0", name="search_corpus", arguments={"query": question, "leg": self.leg},
            result_chunk_ids=[hit.chunk_id for hit in chosen], result_doc_ids=[hit.doc_id for hit in chosen],
            tokens=sum(hit.n_tokens for hit in chosen), candidates=len(hits), wall_ms=backend_ms, backend_ms=backend_ms,
        )
        ranking = [
            RankedDocument(doc_id=hit.doc_id, chunk_id=hit.chunk_id, title=hit.title, justification=f"{self.leg} rank {rank}")
            for rank, hit in enumerate(chosen, start=1)
        ]
        return Trajectory(
            question=question, policy=self.leg, seed=seed, task_id=task_id, config=self.describe(),
            turns=[Turn(index=0, prompt_tokens=0, tool_calls=[call])], final_ranking=ranking,
            stop_reason="answer", chunk_docs={hit.chunk_id: hit.doc_id for hit in chosen},
            wall_s=time.perf_counter() - started,
        )
