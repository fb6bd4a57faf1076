"""A customer's index as the lineage sees it: built from the chunks artifact, BM25 kept in the store.

The dense vectors live in Chroma (embedded folder, `chroma run` server or Cloud). The BM25 index
is a folder of files; it is versioned with the collection (its manifest names the collection
and a fingerprint of the chunk ids) and copied to the artifact store under
`{customer}/index/bm25/`, so a worker with an empty disk (another pod, S3 artifacts) gets the
same sparse leg without rebuilding it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from core.config import EmbeddingConfig
from core.file_lock import exclusive_file_lock
from core.layout import bm25_prefix, chunks_key
from core.storage import ArtifactStore, pull_folder, push_folder
from search.embeddings import TextEmbedder, make_embedder
from search.index import HybridIndex, IndexStats


def embedder_for(settings: EmbeddingConfig) -> TextEmbedder:
    """The customer's embedding model (loaded once per process by the embeddings module)."""
    return make_embedder(settings.model, base_url=settings.base_url, api_key_env=settings.api_key_env, batch_size=settings.batch_size)


@dataclass(frozen=True)
class CustomerIndexBuild:
    index: HybridIndex
    stats: IndexStats
    chunks: pl.DataFrame


def build_customer_index(customer: str, store: ArtifactStore, client, embedder: TextEmbedder, cache_dir: Path) -> CustomerIndexBuild:
    """Make the customer's collection match the chunks artifact, embedding only new chunk ids."""
    chunks = store.read_parquet(chunks_key(customer))
    bm25_dir = cache_dir / customer / "bm25"
    index = HybridIndex(client, customer, embedder, bm25_dir=bm25_dir)
    stats = index.build_or_update(chunks)
    push_folder(store, bm25_dir, bm25_prefix(customer))
    return CustomerIndexBuild(index, stats, chunks)


def open_customer_index(customer: str, store: ArtifactStore, client, embedder: TextEmbedder, cache_dir: Path) -> HybridIndex:
    """Attach to the built index for search (nothing is embedded but the queries).

    A worker without a local BM25 copy pulls it from the store; `HybridIndex.load` rebuilds it
    in memory only if that copy does not match the collection and chunk ids.
    """
    chunks = store.read_parquet(chunks_key(customer))
    bm25_dir = cache_dir / customer / "bm25"
    with exclusive_file_lock(cache_dir / customer / "bm25.lock"):  # service workers start together
        if not bm25_dir.exists():
            pull_folder(store, bm25_prefix(customer), bm25_dir)
    return HybridIndex(client, customer, embedder, bm25_dir=bm25_dir).load(chunks)
