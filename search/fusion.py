"""Reciprocal rank fusion: merge ranked lists by rank alone.

Why RRF: BM25 scores and cosine similarities live on unrelated scales; RRF needs no score
calibration, and k=60 (Cormack et al.; Chroma's `Rrf` default) damps the head of each list so
an item ranked well by both legs beats one ranked first by only one. The same function merges
the final rankings of Nx rollouts.
"""

from __future__ import annotations

from typing import Hashable, Sequence, TypeVar

T = TypeVar("T", bound=Hashable)

RRF_K = 60


def rrf(rankings: Sequence[Sequence[T]], k: int = RRF_K) -> list[tuple[T, float]]:
    """Fuse rankings (best first) into `(item, score)` pairs, best first.

    score(item) = sum over lists containing it of 1 / (k + rank), rank starting at 1. A
    duplicate inside one list counts once, at its best rank. Ties keep a deterministic order:
    the better best rank first, then first appearance across the lists.
    """
    if k < 0:
        raise ValueError("rrf k must be >= 0")
    scores: dict[T, float] = {}
    best_rank: dict[T, int] = {}
    for ranking in rankings:
        seen: set[T] = set()
        for rank, item in enumerate(ranking, start=1):
            if item in seen:
                continue
            seen.add(item)
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
            if rank < best_rank.get(item, 1 << 62):
                best_rank[item] = rank
    order = {item: position for position, item in enumerate(scores)}
    return sorted(scores.items(), key=lambda pair: (-pair[1], best_rank[pair[0]], order[pair[0]]))
