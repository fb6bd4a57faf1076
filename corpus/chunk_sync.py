"""Chunks for the current documents, reusing the previous chunks of every unchanged document.

A document is re-chunked only when its content hash or the chunker's signature (version, size,
overlap, byte cap, tokenizer) changed; otherwise its previous rows are copied, so chunk ids of
unchanged documents are identical across resyncs by construction.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from corpus.chunking import CHUNKER_VERSION, TokenOffsets, chunk_document

CHUNK_SCHEMA = {
    "chunk_id": pl.Utf8,
    "doc_id": pl.Utf8,
    "index": pl.Int32,
    "title": pl.Utf8,
    "text": pl.Utf8,
    "start": pl.Int32,
    "end": pl.Int32,
    "n_tokens": pl.Int32,
    "source": pl.Utf8,
    "uri": pl.Utf8,
    "domain": pl.Utf8,
    "content_hash": pl.Utf8,
    "chunker": pl.Utf8,
}


@dataclass(frozen=True)
class ChunkerSettings:
    size_tokens: int
    overlap_tokens: int
    max_bytes: int
    tokenizer_name: str

    @property
    def signature(self) -> str:
        return f"v{CHUNKER_VERSION}:{self.size_tokens}:{self.overlap_tokens}:{self.max_bytes}:{self.tokenizer_name}"


@dataclass
class ChunkSyncResult:
    chunks: pl.DataFrame
    rechunked_docs: int
    reused_docs: int


def empty_chunks() -> pl.DataFrame:
    return pl.DataFrame(schema=CHUNK_SCHEMA)


def sync_chunks(
    documents: pl.DataFrame,
    previous: pl.DataFrame | None,
    tokenizer: TokenOffsets,
    settings: ChunkerSettings,
) -> ChunkSyncResult:
    live = documents.filter(~pl.col("deleted"))
    reusable: dict[str, str] = {}
    if previous is not None and previous.height:
        reusable = {
            row["doc_id"]: row["content_hash"]
            for row in previous.filter(pl.col("chunker") == settings.signature)
            .select("doc_id", "content_hash")
            .unique("doc_id")
            .iter_rows(named=True)
        }
    reuse_ids = [
        row["doc_id"] for row in live.select("doc_id", "content_hash").iter_rows(named=True) if reusable.get(row["doc_id"]) == row["content_hash"]
    ]
    reuse_set = set(reuse_ids)
    kept = previous.filter(pl.col("doc_id").is_in(reuse_ids)) if reuse_ids else empty_chunks()
    rows = []
    rechunked = 0
    for doc in live.filter(~pl.col("doc_id").is_in(list(reuse_set))).iter_rows(named=True):
        rechunked += 1
        for chunk in chunk_document(
            doc["doc_id"], doc["text"], doc["kind"], tokenizer, settings.size_tokens, settings.overlap_tokens, settings.max_bytes
        ):
            rows.append(
                {
                    "chunk_id": chunk.chunk_id,
                    "doc_id": chunk.doc_id,
                    "index": chunk.index,
                    "title": doc["title"],
                    "text": chunk.text,
                    "start": chunk.start,
                    "end": chunk.end,
                    "n_tokens": chunk.n_tokens,
                    "source": doc["source"],
                    "uri": doc["uri"],
                    "domain": doc["domain"],
                    "content_hash": doc["content_hash"],
                    "chunker": settings.signature,
                }
            )
    fresh = pl.DataFrame(rows, schema=CHUNK_SCHEMA) if rows else empty_chunks()
    chunks = pl.concat([kept.select(list(CHUNK_SCHEMA)), fresh]).sort(["doc_id", "index"])
    return ChunkSyncResult(chunks, rechunked, len(reuse_set))
