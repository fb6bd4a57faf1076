"""A customer's index as the lineage sees it: built from the chunks artifact, BM25 kept in the store.

The dense vectors live in Chroma (embedded folder, `chroma run` server or Cloud). The BM25 index
is a folder of files; it is versioned with the collection (its manifest names the collection
and a fingerprint of the chunk ids) and copied to the artifact store under
`{customer}/index/bm25/`, so a worker with an empty disk (another pod, S3 artifacts) gets the
same sparse leg without rebuilding it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from corpus.config import EmbeddingConfig
from corpus.stage import chunks_key
from corpus.storage import ArtifactStore
from retrieval.embeddings import TextEmbedder, make_embedder
from retrieval.index import HybridIndex, IndexStats


def embedder_for(settings: EmbeddingConfig) -> TextEmbedder:
    """The customer's embedding model (loaded once per process by the embeddings module)."""
    return make_embedder(settings.model, base_url=settings.base_url, api_key_env=settings.api_key_env, batch_size=settings.batch_size)


def bm25_prefix(customer: str) -> str:
    return f"{customer}/index/bm25/"


def push_folder(store: ArtifactStore, folder: Path, prefix: str) -> int:
    count = 0
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            store.write_bytes(prefix + path.relative_to(folder).as_posix(), path.read_bytes())
            count += 1
    return count


def pull_folder(store: ArtifactStore, prefix: str, folder: Path) -> int:
    """Replace `folder` with the store's copy (if any); returns how many files came down."""
    keys = list(store.list(prefix))
    if not keys:
        return 0
    staging = folder.with_name(folder.name + ".pull")
    shutil.rmtree(staging, ignore_errors=True)
    for key in keys:
        target = staging / key[len(prefix) :]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.read_bytes(key))
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return len(keys)


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
    if not bm25_dir.exists():
        pull_folder(store, bm25_prefix(customer), bm25_dir)
    return HybridIndex(client, customer, embedder, bm25_dir=bm25_dir).load(chunks)
