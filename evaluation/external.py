"""External benchmark files (question, answer, paragraphs with `is_supporting`) as bench tasks
over one pooled, indexed corpus.

Why pool: each record carries its own ~10-20 paragraph pool; scoring a policy inside that tiny
pool would make retrieval trivial. The union of all pools (deduplicated by title + text) makes
every question compete with ~5,000 paragraphs, the way a customer's corpus would.

Why the title goes into the document text: the index embeds and BM25-scores chunk texts only
(titles are metadata), and a Wikipedia paragraph often names its subject only in its title
(MuSiQue sections especially); a customer's documents carry their headings in their text too.

Why a cache keyed by the file's sha256 (and the chunker and embedding model): embedding ~5,500
paragraphs costs minutes on CPU; the same file with the same settings reuses the index.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from core.file_lock import exclusive_file_lock
from corpus.chunk_sync import CHUNK_SCHEMA, ChunkerSettings
from corpus.chunking import chunk_document
from evaluation.answers import answer_doc_ids
from evaluation.metrics import Gold
from evaluation.tasks import Task

log = logging.getLogger(__name__)

DEFAULT_OVERLAP_TOKENS = 32
_READY = "ready.json"


@dataclass(frozen=True)
class ExternalRecord:
    id: str
    question: str
    answer: str
    paragraphs: tuple[dict[str, Any], ...]
    source: str = ""


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_records(path: str | Path, limit: int | None = None) -> list[ExternalRecord]:
    """The file's records in order (first `limit`); a line that is not a valid record raises."""
    records = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                records.append(
                    ExternalRecord(
                        id=str(row["id"]), question=row["question"], answer=str(row["answer"]),
                        paragraphs=tuple(row["paragraphs"]), source=row.get("source", ""),
                    )
                )
            except (KeyError, TypeError, json.JSONDecodeError) as error:
                raise ValueError(f"{path}:{number}: not a benchmark record ({type(error).__name__}: {error})") from None
            if limit is not None and len(records) >= limit:
                break
    return records


def paragraph_doc_id(title: str, text: str) -> str:
    """Stable id of a pooled paragraph: a hash of title and text, so duplicates collapse."""
    return "p" + hashlib.sha256(f"{title}\x00{text}".encode()).hexdigest()[:16]


def document_text(title: str, text: str) -> str:
    return f"{title}\n{text}" if title else text


def source_group(source: str) -> str:
    """`HotpotQA (dev, distractor setting) via owner/repo...` -> `HotpotQA`."""
    head = source.split(" via ")[0].strip()
    return head.split(" (")[0].split()[0] if head else ""


def pooled_documents(records: Sequence[ExternalRecord]) -> pl.DataFrame:
    """One row per distinct paragraph of all records: doc_id, title, text (title included)."""
    rows: dict[str, dict[str, str]] = {}
    for record in records:
        for paragraph in record.paragraphs:
            title, text = paragraph.get("title", "") or "", paragraph.get("text", "") or ""
            doc_id = paragraph_doc_id(title, text)
            rows.setdefault(doc_id, {"doc_id": doc_id, "title": title, "text": document_text(title, text)})
    return pl.DataFrame(list(rows.values()), schema={"doc_id": pl.Utf8, "title": pl.Utf8, "text": pl.Utf8})


def tasks_from_records(records: Sequence[ExternalRecord]) -> list[Task]:
    """Gold = the record's `is_supporting` paragraphs (paragraph level, never by title: MuSiQue
    pools repeat titles). Answer documents = gold paragraphs containing the answer; none (yes/no)
    means every gold paragraph must be returned."""
    tasks = []
    for record in records:
        texts: dict[str, str] = {}
        gold_ids: list[str] = []
        for paragraph in record.paragraphs:
            title, text = paragraph.get("title", "") or "", paragraph.get("text", "") or ""
            doc_id = paragraph_doc_id(title, text)
            texts[doc_id] = document_text(title, text)
            if paragraph.get("is_supporting"):
                gold_ids.append(doc_id)
        gold = Gold(
            doc_ids=frozenset(gold_ids),
            answer=record.answer,
            answer_doc_ids=answer_doc_ids(record.answer, texts, among=gold_ids),
        )
        tasks.append(Task(record.id, record.question, gold, source_group(record.source), {"answer": record.answer, "source": record.source}))
    return tasks


def chunk_pooled(documents: pl.DataFrame, embedding_model: str | None = None) -> pl.DataFrame:
    """Chunk every pooled document with the project's chunker at the embedding window."""
    from search.embedding_window import embedding_model_info, load_token_offsets

    info = embedding_model_info(embedding_model)
    tokenizer = load_token_offsets(embedding_model)
    size = info.max_chunk_tokens
    settings = ChunkerSettings(size, min(DEFAULT_OVERLAP_TOKENS, size // 2), 16_384, info.name)
    rows = []
    for doc in documents.iter_rows(named=True):
        for chunk in chunk_document(doc["doc_id"], doc["text"], "text", tokenizer, settings.size_tokens, settings.overlap_tokens, settings.max_bytes):
            rows.append(
                {
                    "chunk_id": chunk.chunk_id, "doc_id": chunk.doc_id, "index": chunk.index, "title": doc["title"],
                    "text": chunk.text, "start": chunk.start, "end": chunk.end, "n_tokens": chunk.n_tokens,
                    "source": "benchmark", "uri": doc["doc_id"], "domain": "web",
                    "content_hash": hashlib.sha256(doc["text"].encode()).hexdigest()[:16], "chunker": settings.signature,
                }
            )
    return pl.DataFrame(rows, schema=CHUNK_SCHEMA)


@dataclass
class ExternalBenchmark:
    """A loaded external file: its tasks, its pooled index and what built it (for the report)."""

    path: Path
    sha256: str
    tasks: list[Task]
    index: Any  # search.index.HybridIndex
    n_documents: int
    n_chunks: int
    cache_dir: Path
    built: bool  # False when the cached index was reused
    embedding_model: str

    def config(self) -> dict[str, Any]:
        return {
            "tasks_file": str(self.path), "tasks_sha256": self.sha256, "n_documents": self.n_documents,
            "n_chunks": self.n_chunks, "index_cache": str(self.cache_dir), "index_reused": not self.built,
            "embedding_model": self.embedding_model, "index_collection": self.index.name,
        }


def default_cache_root() -> Path:
    from core.registry import searchsmith_home

    return searchsmith_home() / "cache" / "benchmarks"


def load_external_benchmark(
    path: str | Path,
    limit: int | None = None,
    cache_root: str | Path | None = None,
    embedding_model: str | None = None,
) -> ExternalBenchmark:
    """Tasks from the file (first `limit`) over the pooled corpus of the WHOLE file.

    The corpus always pools every record (so `--limit` changes which questions run, not how hard
    retrieval is), and the index is cached under `cache_root/<sha256[:16]>`.
    """
    from search.chroma_client import persistent_client
    from search.embeddings import make_embedder
    from search.index import HybridIndex

    path = Path(path)
    sha = file_sha256(path)
    records = read_records(path)
    if not records:
        raise ValueError(f"{path}: no benchmark records")
    cache_dir = Path(cache_root or default_cache_root()) / sha[:16]
    embedder = make_embedder(embedding_model)
    chunks_path = cache_dir / f"chunks-{_slug(embedder.name)}.parquet"
    ready_path = cache_dir / f"{_slug(embedder.name)}-{_READY}"
    index = HybridIndex(persistent_client(cache_dir / "chroma"), f"bench-{sha[:12]}", embedder, bm25_dir=cache_dir / f"bm25-{_slug(embedder.name)}")
    built = False
    # One process builds a file's index; another run over the same file waits, then loads it.
    with exclusive_file_lock(cache_dir / f"{_slug(embedder.name)}.lock"):
        if ready_path.exists() and chunks_path.exists():
            chunks = pl.read_parquet(chunks_path)
            index.load(chunks)
        else:
            documents = pooled_documents(records)
            chunks = chunk_pooled(documents, embedding_model)
            log.info("indexing %d paragraphs (%d chunks) of %s into %s", documents.height, chunks.height, path.name, cache_dir)
            index.build_or_update(chunks)
            chunks.write_parquet(chunks_path)
            ready_path.write_text(json.dumps({"file": str(path), "sha256": sha, "collection": index.name, "chunks": chunks.height}))
            built = True
    tasks = tasks_from_records(records[:limit] if limit else records)
    return ExternalBenchmark(
        path=path, sha256=sha, tasks=tasks, index=index, n_documents=chunks.get_column("doc_id").n_unique(),
        n_chunks=chunks.height, cache_dir=cache_dir, built=built, embedding_model=embedder.name,
    )


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in text.lower())[:48]
