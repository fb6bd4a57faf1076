"""Lineage stage 1: sources -> raw_documents -> chunks (thin wrappers over corpus/)."""


import dagster as dg

from assets.metadata import markdown_table
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, CustomersResource
from assets.retries import TransientRetry, retry_transient
from core.layout import chunks_key, documents_key, quarantine_key
from corpus.per_customer import chunk_customer_documents, sync_customer_documents
from search.embedding_window import embedding_model_info, load_token_offsets

SYNC_RETRY = TransientRetry(max_retries=2, delay_s=10)


@dg.asset(
    partitions_def=customers_partitions,
    group_name="corpus",
    kinds={"python", "parquet"},
    description="Synced documents (incremental): only new and changed items are fetched and parsed; "
    "deletions become tombstones; unusable inputs go to the quarantine table with a reason. "
    "Network failures are retried (twice, 10 s then 20 s); other errors and interrupts are not.",
)
def raw_documents(context: dg.AssetExecutionContext, store: ArtifactStoreResource, customers: CustomersResource) -> dg.MaterializeResult:
    name = context.partition_key
    config = customers.get(name)
    artifacts = store.get()
    with retry_transient(context, SYNC_RETRY):
        result = sync_customer_documents(config, artifacts, customers.work_dir(name, "sources"))
    for row in result.quarantine.iter_rows(named=True):
        context.log.warning(f"quarantined {row['uri']} ({row['stage']}): {row['reason']}")
    live = result.documents.filter(~result.documents["deleted"]).height
    return dg.MaterializeResult(
        metadata={
            **result.counts.as_dict(),
            "documents": live,
            "tombstones": result.documents.height - live,
            "path": dg.MetadataValue.path(artifacts.uri(documents_key(name))),
            "quarantine_path": dg.MetadataValue.path(artifacts.uri(quarantine_key(name))),
            "quarantine": dg.MetadataValue.md(markdown_table(result.quarantine)),
        }
    )


@dg.asset(
    partitions_def=customers_partitions,
    group_name="corpus",
    kinds={"python", "parquet"},
    deps=[raw_documents],
    description="Token-aware, structure-aware chunks with content-hash ids; unchanged documents keep their chunks.",
)
def chunks(context: dg.AssetExecutionContext, store: ArtifactStoreResource, customers: CustomersResource) -> dg.MaterializeResult:
    name = context.partition_key
    config = customers.get(name)
    # An endpoint-served embedding model has no local tokenizer: chunk with the default one.
    model = embedding_model_info(None if config.embedding.base_url else config.embedding.model)
    artifacts = store.get()
    result, warning = chunk_customer_documents(config, artifacts, load_token_offsets(str(model.path)), model.name, model.max_chunk_tokens)
    if warning:
        context.log.warning(warning)
    tokens = result.chunks["n_tokens"]
    return dg.MaterializeResult(
        metadata={
            "chunks": result.chunks.height,
            "rechunked_documents": result.rechunked_docs,
            "reused_documents": result.reused_docs,
            "mean_tokens": float(tokens.mean() or 0),
            "max_tokens": int(tokens.max() or 0),
            "chunk_size_tokens": model.max_chunk_tokens if not config.chunking.size_tokens else config.chunking.size_tokens,
            "path": dg.MetadataValue.path(artifacts.uri(chunks_key(name))),
        }
    )
