"""Lineage stage 2: chunks -> chroma_index (dense in Chroma + BM25 beside it), with checks."""

import random

import dagster as dg

from assets.corpus_assets import chunks
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, ChromaResource, CustomersResource
from assets.retries import TransientRetry, retry_transient
from core.layout import chunks_key
from search.index_checks import dense_recall_vs_brute_force, index_count_matches_chunks, no_duplicate_ids
from search.per_customer import build_customer_index, embedder_for, open_customer_index

RECALL_SAMPLE = 20
RECALL_FLOOR = 0.9
INDEX_RETRY = TransientRetry(max_retries=2, delay_s=10)


def customer_embedder(customers: CustomersResource, name: str):
    return embedder_for(customers.get(name).embedding)


@dg.asset(
    partitions_def=customers_partitions,
    group_name="retrieval",
    kinds={"chroma", "python"},
    deps=[chunks],
    description="One Chroma collection per customer (dense) plus a BM25 index in the artifact store; "
    "only new chunk ids are embedded, removed ones are deleted. "
    "Network failures are retried (twice, 10 s then 20 s); other errors and interrupts are not.",
)
def chroma_index(
    context: dg.AssetExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource
) -> dg.MaterializeResult:
    name = context.partition_key
    with retry_transient(context, INDEX_RETRY):
        build = build_customer_index(name, store.get(), chroma.client(), customer_embedder(customers, name), chroma.cache_dir())
    stats = build.stats.as_dict()
    context.log.info(f"index {stats['collection']}: embedded {stats['embedded']}, deleted {stats['deleted']}, kept {stats['kept']}")
    return dg.MaterializeResult(metadata={**stats, "chroma_mode": chroma.resolved().mode, "embedding_model": build.index.embedder.name})


def open_index(name: str, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource):
    """The customer's built index for search, as every downstream asset opens it."""
    return open_customer_index(name, store.get(), chroma.client(), customer_embedder(customers, name), chroma.cache_dir())


def _open_for_check(context: dg.AssetCheckExecutionContext, store, chroma, customers):
    return context.partition_key, open_index(context.partition_key, store, chroma, customers)


@dg.asset_check(asset=chroma_index, blocking=True, description="The collection, BM25 and chunk table hold exactly the chunk ids.")
def index_count_matches_chunks_check(
    context: dg.AssetCheckExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource
) -> dg.AssetCheckResult:
    name, index = _open_for_check(context, store, chroma, customers)
    passed, details = index_count_matches_chunks(index, store.get().read_parquet(chunks_key(name)))
    return dg.AssetCheckResult(passed=passed, metadata=details)


@dg.asset_check(asset=chroma_index, blocking=True, description="No chunk id is stored twice.")
def no_duplicate_ids_check(
    context: dg.AssetCheckExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource
) -> dg.AssetCheckResult:
    _, index = _open_for_check(context, store, chroma, customers)
    passed, details = no_duplicate_ids(index)
    return dg.AssetCheckResult(passed=passed, metadata=details)


@dg.asset_check(asset=chroma_index, description="HNSW top-10 agrees with exact cosine search on a sample of chunk-derived queries.")
def dense_recall_matches_brute_force(
    context: dg.AssetCheckExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource
) -> dg.AssetCheckResult:
    _, index = _open_for_check(context, store, chroma, customers)
    texts = index.state.table.texts
    sample = random.Random(0).sample(texts, min(RECALL_SAMPLE, len(texts)))
    queries = [" ".join(text.split()[:24]) for text in sample if text.strip()]
    recall = dense_recall_vs_brute_force(index, queries, k=10)
    return dg.AssetCheckResult(passed=recall >= RECALL_FLOOR, metadata={"recall_at_10": recall, "queries": len(queries), "floor": RECALL_FLOOR})
