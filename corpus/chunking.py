"""Token-aware, structure-aware chunking with content-hash chunk ids.

Why token-aware: the dense leg embeds each chunk with a model that truncates at its window
(all-MiniLM-L6-v2: 256 tokens); a longer chunk silently loses its tail in the dense index.
Why structure-aware: a chunk that starts at a markdown heading or a code block boundary reads
as a unit to both the retriever and the agent. Why content-hash ids: an unchanged document
yields identical chunk ids across resyncs, so its vectors are never recomputed.

The document is tokenized once; blocks (heading sections, paragraphs, code blocks) are packed
greedily up to `size_tokens`; a block longer than that is cut into token windows that overlap
by `overlap_tokens`. Every chunk is also held under `max_bytes` (Chroma Cloud's 16,384-byte
document limit) by halving.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from dataclasses import dataclass
from typing import Protocol

CHUNKER_VERSION = "1"

_HEADING = re.compile(r"^#{1,6}\s", flags=re.MULTILINE)
_BLANK_LINES = re.compile(r"\n[ \t]*\n+")


class TokenOffsets(Protocol):
    """Anything that can tell where each token of a text starts and ends (character offsets)."""

    def offsets(self, text: str) -> list[tuple[int, int]]: ...


@dataclass(frozen=True)
class ChunkSpan:
    start: int
    end: int
    n_tokens: int


@dataclass(frozen=True)
class Chunk:
    chunk_id: str
    doc_id: str
    index: int
    text: str
    start: int
    end: int
    n_tokens: int


def chunk_id_for(doc_id: str, text: str) -> str:
    return hashlib.sha256(f"{doc_id}\x00{text}".encode()).hexdigest()[:20]


def _blocks(text: str, kind: str) -> list[tuple[int, int]]:
    """Character spans of structural blocks, in order, covering the non-blank text."""
    cuts = {0, len(text)}
    if kind == "markdown":
        cuts.update(m.start() for m in _HEADING.finditer(text))
    for match in _BLANK_LINES.finditer(text):
        cuts.add(match.end())
    ordered = sorted(cuts)
    spans = []
    for start, end in zip(ordered, ordered[1:]):
        segment = text[start:end]
        stripped = segment.strip()
        if not stripped:
            continue
        lead = len(segment) - len(segment.lstrip())
        spans.append((start + lead, start + lead + len(stripped)))
    return spans


class _TokenIndex:
    def __init__(self, token_spans: list[tuple[int, int]]):
        self.starts = [s for s, _ in token_spans]
        self.ends = [e for _, e in token_spans]

    def count(self, start: int, end: int) -> int:
        return bisect.bisect_left(self.starts, end) - bisect.bisect_left(self.starts, start)

    def windows(self, start: int, end: int, size: int, overlap: int) -> list[ChunkSpan]:
        first, last = bisect.bisect_left(self.starts, start), bisect.bisect_left(self.starts, end)
        step = max(1, size - overlap)
        spans = []
        for lo in range(first, last, step):
            hi = min(lo + size, last)
            spans.append(ChunkSpan(self.starts[lo], min(self.ends[hi - 1], end), hi - lo))
            if hi == last:
                break
        return spans


def plan_chunks(text: str, kind: str, tokenizer: TokenOffsets, size_tokens: int, overlap_tokens: int) -> list[ChunkSpan]:
    if overlap_tokens >= size_tokens:
        raise ValueError(f"chunk overlap ({overlap_tokens}) must be smaller than chunk size ({size_tokens})")
    index = _TokenIndex(tokenizer.offsets(text))
    spans: list[ChunkSpan] = []
    current: ChunkSpan | None = None
    for start, end in _blocks(text, kind):
        n = index.count(start, end)
        if n > size_tokens:
            if current:
                spans.append(current)
                current = None
            spans.extend(index.windows(start, end, size_tokens, overlap_tokens))
            continue
        # A markdown heading starts a new chunk so sections are not glued to the previous one.
        starts_section = kind == "markdown" and text.startswith("#", start)
        if current and current.n_tokens + n <= size_tokens and not (starts_section and current.n_tokens > size_tokens // 4):
            current = ChunkSpan(current.start, end, index.count(current.start, end))
        else:
            if current:
                spans.append(current)
            current = ChunkSpan(start, end, n)
    if current:
        spans.append(current)
    return spans


def _cap_bytes(text: str, start: int, span: ChunkSpan, max_bytes: int, tokenizer: TokenOffsets) -> list[ChunkSpan]:
    piece = text[span.start : span.end]
    if len(piece.encode("utf-8")) <= max_bytes or span.end - span.start < 2:
        return [span]
    middle = span.start + (span.end - span.start) // 2
    halves = [(span.start, middle), (middle, span.end)]
    result = []
    for lo, hi in halves:
        n = len(tokenizer.offsets(text[lo:hi]))
        result.extend(_cap_bytes(text, start, ChunkSpan(lo, hi, n), max_bytes, tokenizer))
    return result


def chunk_document(
    doc_id: str,
    text: str,
    kind: str,
    tokenizer: TokenOffsets,
    size_tokens: int,
    overlap_tokens: int,
    max_bytes: int = 16_384,
) -> list[Chunk]:
    spans = []
    for span in plan_chunks(text, kind, tokenizer, size_tokens, overlap_tokens):
        spans.extend(_cap_bytes(text, 0, span, max_bytes, tokenizer))
    chunks = []
    seen: set[str] = set()
    for span in spans:
        piece = text[span.start : span.end]
        chunk_id = chunk_id_for(doc_id, piece)
        if chunk_id in seen:  # identical repeated text in one document: keep the first
            continue
        seen.add(chunk_id)
        chunks.append(Chunk(chunk_id, doc_id, len(chunks), piece, span.start, span.end, span.n_tokens))
    return chunks
