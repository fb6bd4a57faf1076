"""The corpus stage as two calls the assets (and benchmarks) make: sync documents, then chunk.

Artifacts live under the customer's prefix in the artifact store:
`{customer}/corpus/raw_documents.parquet`, `quarantine.parquet`, `source_status.json`, `chunks.parquet`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable

from core.config import CustomerConfig
from core.layout import chunks_key, documents_key, quarantine_key, source_status_key
from core.storage import ArtifactStore
from corpus.chunk_sync import ChunkerSettings, ChunkSyncResult, sync_chunks
from corpus.chunking import TokenOffsets
from corpus.sources import build_connector
from corpus.sync import SyncResult, sync_sources

log = logging.getLogger(__name__)


def sync_customer_documents(
    config: CustomerConfig,
    store: ArtifactStore,
    work_dir: Path,
    on_event: Callable[[str], None] | None = None,
) -> SyncResult:
    previous = store.read_parquet_or_none(documents_key(config.name))
    connectors = [build_connector(source, config, work_dir / f"source{i}") for i, source in enumerate(config.sources)]
    result = sync_sources(connectors, previous, config.domain, on_event=on_event)
    store.write_parquet(quarantine_key(config.name), result.quarantine)
    store.write_parquet(documents_key(config.name), result.documents)
    store.write_text(source_status_key(config.name), json.dumps([status.as_dict() for status in result.sources], indent=2))
    return result


def resolve_chunk_size(config: CustomerConfig, embedding_window: int) -> tuple[int, str | None]:
    """The configured chunk size, or the embedding window; a warning when it exceeds the window."""
    size = config.chunking.size_tokens or embedding_window
    warning = None
    if size > embedding_window:
        warning = (
            f"customer {config.name}: chunking.size_tokens={size} exceeds the embedding model's window of "
            f"{embedding_window} tokens; the dense index will only see the first {embedding_window} tokens of each chunk"
        )
        log.warning(warning)
    return size, warning


def chunk_customer_documents(
    config: CustomerConfig,
    store: ArtifactStore,
    tokenizer: TokenOffsets,
    tokenizer_name: str,
    embedding_window: int,
) -> tuple[ChunkSyncResult, str | None]:
    documents = store.read_parquet(documents_key(config.name))
    previous = store.read_parquet_or_none(chunks_key(config.name))
    size, warning = resolve_chunk_size(config, embedding_window)
    settings = ChunkerSettings(size, min(config.chunking.overlap_tokens, size // 2), config.chunking.max_bytes, tokenizer_name)
    result = sync_chunks(documents, previous, tokenizer, settings)
    store.write_parquet(chunks_key(config.name), result.chunks)
    return result, warning
