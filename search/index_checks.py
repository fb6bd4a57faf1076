"""The index's asset checks: pure functions over a built `HybridIndex`, each `(passed, details)`.

Why apart from the index: they read the index from outside (what Chroma stores, what BM25 and
the chunk table hold) the way an operator would, and only the asset layer runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from search.index import HybridIndex


def index_count_matches_chunks(index: HybridIndex, chunks: pl.DataFrame) -> tuple[bool, dict[str, Any]]:
    """The collection, BM25 and in-memory table each hold exactly the table's unique chunk ids."""
    expected = set(chunks.get_column("chunk_id").to_list())
    stored = set(index.stored_ids())
    state = index.state
    details = {
        "chunks": len(expected),
        "collection": index.collection.count(),
        "bm25": len(state.bm25),
        "table": len(state.table),
        "missing": len(expected - stored),
        "extra": len(stored - expected),
    }
    ok = details["missing"] == 0 and details["extra"] == 0 and details["chunks"] == details["collection"] == details["bm25"] == details["table"]
    return ok, details


def no_duplicate_ids(index: HybridIndex) -> tuple[bool, dict[str, Any]]:
    """No chunk id appears twice in the collection, the BM25 id list or the in-memory table."""
    stored = index.stored_ids()
    state = index.state
    details = {
        "collection_duplicates": len(stored) - len(set(stored)),
        "bm25_duplicates": len(state.bm25.ids) - len(set(state.bm25.ids)),
        "table_duplicates": len(state.table.ids) - len(set(state.table.ids)),
    }
    return all(value == 0 for value in details.values()), details


def stored_embeddings(index: HybridIndex) -> tuple[list[str], np.ndarray]:
    """Every id and vector in the collection, paged."""
    collection = index.collection
    ids: list[str] = []
    blocks: list[np.ndarray] = []
    offset = 0
    while True:
        page = collection.get(include=["embeddings"], limit=index.read_batch, offset=offset)
        ids.extend(page["ids"])
        if len(page["ids"]):
            blocks.append(np.asarray(page["embeddings"], dtype=np.float32))
        if len(page["ids"]) < index.read_batch:
            break
        offset += len(page["ids"])
    dims = blocks[0].shape[1] if blocks else 0
    return ids, (np.concatenate(blocks) if blocks else np.zeros((0, dims), dtype=np.float32))


def dense_recall_vs_brute_force(index: HybridIndex, sample_queries: Sequence[str] | np.ndarray, k: int = 10) -> float:
    """Mean overlap of Chroma's HNSW top-k with exact cosine top-k over all stored vectors.

    `sample_queries` are texts (embedded with the index's embedder) or a 2-D array of vectors.
    """
    ids, matrix = stored_embeddings(index)
    if not len(ids) or not len(sample_queries):
        return 1.0
    if isinstance(sample_queries, np.ndarray):
        queries = np.asarray(sample_queries, dtype=np.float32).reshape(len(sample_queries), -1)
    else:
        queries = np.stack([index.embed_query(query) for query in sample_queries])
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    unit = matrix / norms
    k = min(k, len(ids))
    recalls = []
    for vector in queries:
        q = vector / (np.linalg.norm(vector) or 1.0)
        exact = {ids[i] for i in np.argsort(-(unit @ q), kind="stable")[:k]}
        approx = index.collection.query(query_embeddings=vector.reshape(1, -1), n_results=k, include=[])["ids"][0]
        recalls.append(len(exact & set(approx)) / k)
    return float(np.mean(recalls))
