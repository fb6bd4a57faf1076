"""The corpus as task generation sees it: whole documents by id, and their chunk ids.

Quotes are checked against whole documents (a supporting item is a document, as in
Context-1), while distractors are chunks (what the agent's search returns). The documents
table (`corpus.sync.DOCUMENT_SCHEMA`) gives the exact text; without it a document's text is
its chunks joined in order, which is what the agent can read through `read_document`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

import polars as pl


@dataclass(frozen=True)
class SourceDoc:
    doc_id: str
    title: str
    text: str
    kind: str = "text"
    content_hash: str = ""


class CorpusView(Mapping[str, str]):
    """doc_id -> text (so it can be handed to the verifier directly), plus titles and chunks."""

    def __init__(self, docs: dict[str, SourceDoc], chunks_by_doc: dict[str, list[str]] | None = None):
        self.docs = docs
        self.chunks_by_doc = chunks_by_doc or {}

    @classmethod
    def from_frames(cls, chunks: pl.DataFrame | None, documents: pl.DataFrame | None = None) -> "CorpusView":
        chunks_by_doc: dict[str, list[str]] = {}
        texts_by_doc: dict[str, list[tuple[int, str]]] = {}
        meta: dict[str, dict[str, str]] = {}
        if chunks is not None and chunks.height:
            order = chunks.sort(["doc_id", "index"]) if "index" in chunks.columns else chunks
            for row in order.iter_rows(named=True):
                doc_id = row["doc_id"]
                chunks_by_doc.setdefault(doc_id, []).append(row["chunk_id"])
                texts_by_doc.setdefault(doc_id, []).append((int(row.get("index") or 0), row.get("text") or ""))
                meta.setdefault(doc_id, {"title": row.get("title") or "", "kind": row.get("kind") or _kind_of(row),
                                         "content_hash": row.get("content_hash") or ""})
        docs: dict[str, SourceDoc] = {}
        if documents is not None and documents.height:
            live = documents.filter(~pl.col("deleted")) if "deleted" in documents.columns else documents
            for row in live.iter_rows(named=True):
                docs[row["doc_id"]] = SourceDoc(row["doc_id"], row.get("title") or "", row.get("text") or "",
                                                row.get("kind") or "text", row.get("content_hash") or "")
        for doc_id, parts in texts_by_doc.items():
            if doc_id not in docs:
                text = "\n\n".join(text for _, text in sorted(parts, key=lambda p: p[0]))
                info = meta[doc_id]
                digest = info["content_hash"] or hashlib.sha256(text.encode()).hexdigest()
                docs[doc_id] = SourceDoc(doc_id, info["title"], text, info["kind"], digest)
        return cls(docs, chunks_by_doc)

    def __getitem__(self, doc_id: str) -> str:
        return self.docs[doc_id].text

    def __iter__(self):
        return iter(self.docs)

    def __len__(self) -> int:
        return len(self.docs)

    def title(self, doc_id: str) -> str:
        doc = self.docs.get(doc_id)
        return doc.title if doc else ""

    def content_hash(self, doc_id: str) -> str | None:
        doc = self.docs.get(doc_id)
        if doc is None:
            return None
        return doc.content_hash or hashlib.sha256(doc.text.encode()).hexdigest()

    def fingerprint(self) -> str:
        """Changes whenever any document is added, removed or edited."""
        digest = hashlib.sha256()
        for doc_id in sorted(self.docs):
            digest.update(f"{doc_id}\x00{self.content_hash(doc_id)}\x00".encode())
        return digest.hexdigest()[:16]


def _kind_of(row: Mapping[str, object]) -> str:
    """Chunk rows carry no kind; guess code from the uri's extension so seeds skip source files."""
    uri = str(row.get("uri") or "")
    code_ext = (".py", ".js", ".ts", ".go", ".rs", ".java", ".c", ".cc", ".cpp", ".h", ".rb", ".sh", ".toml", ".json", ".yaml", ".yml")
    return "code" if uri.endswith(code_ext) else "text"
