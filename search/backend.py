"""What the agent harness needs from a customer's index, as one small interface.

The harness's four tools are built on these calls; the hybrid Chroma + BM25 index implements
them for customers and for pooled benchmark corpora alike. `exclude` carries the chunk ids the
agent has already seen: implementations over-fetch and drop them in code (Chroma ignores `$nin`
on ids, and a metadata `$nin` costs ~0.3 s per query at 100k chunks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Protocol


@dataclass(frozen=True)
class Hit:
    chunk_id: str
    doc_id: str
    title: str
    text: str
    score: float
    n_tokens: int = 0
    rank: int = 0


class SearchBackend(Protocol):
    def search(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]:
        """Hybrid search: BM25 and dense legs (top 50 each), fused by RRF (k=60), best first."""

    def search_bm25(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]: ...

    def search_dense(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]: ...

    def grep(self, pattern: str, limit: int = 5, exclude: Collection[str] = ()) -> list[Hit]:
        """Regex over chunk texts; raises `ValueError` for an invalid or too-slow pattern."""

    def document_chunks(self, doc_id: str) -> list[Hit]:
        """Every chunk of one document in reading order; empty list for an unknown id."""

    def document_title(self, doc_id: str) -> str | None: ...
