"""Reading (and writing) the final answer: a ranked list of `<Document id=...>` entries.

Why tolerant: small and half-trained models emit quoted and unquoted ids, forget the
`<Justification>` tags, repeat documents, cite a chunk id where a document id belongs, or emit
prose. None of that may crash an episode or a benchmark: every entry that can be read is kept
in order, duplicates are dropped, a chunk id is mapped to its document, and whatever cannot be
used is recorded in `errors` (the trajectory keeps them; the scorer sees an empty or partial
ranking, never an exception).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from agent.trajectory import RankedDocument

_DOCUMENT_TAG = re.compile(r"<\s*Document\b([^>]*)>", flags=re.IGNORECASE)
_ID_ATTRIBUTE = re.compile(r"""\bid\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>/]+))""", flags=re.IGNORECASE)
_JUSTIFICATION = re.compile(r"<\s*Justification\s*>(.*?)(?:<\s*/\s*Justification\s*>|$)", flags=re.IGNORECASE | re.DOTALL)
_SEGMENT_END = re.compile(r"<\s*/\s*Document\s*>", flags=re.IGNORECASE)
_TAG = re.compile(r"<[^>]{0,200}>")
_SPACES = re.compile(r"\s+")


@dataclass
class ParsedAnswer:
    documents: list[RankedDocument] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _clean(text: str, limit: int = 1000) -> str:
    return _SPACES.sub(" ", _TAG.sub(" ", text)).strip()[:limit]


def parse_final_answer(
    text: str | None,
    *,
    document_title: Callable[[str], str | None],
    chunk_docs: Mapping[str, str] | None = None,
    max_docs: int = 10,
) -> ParsedAnswer:
    """Parse `<Document id=X><Justification>...</Justification></Document>` entries in order.

    `document_title(doc_id)` returns None for an id the corpus does not hold; `chunk_docs` maps
    the chunks the agent saw to their documents (a cited chunk id becomes its document, and
    gives the entry its `chunk_id`).
    """
    chunk_docs = chunk_docs or {}
    parsed = ParsedAnswer()
    if not text or not text.strip():
        parsed.errors.append("empty final answer")
        return parsed
    tags = list(_DOCUMENT_TAG.finditer(text))
    if not tags:
        parsed.errors.append("no <Document id=...> entries found in the final answer")
        return parsed
    first_chunk_of_doc: dict[str, str] = {}
    for chunk_id, doc_id in chunk_docs.items():
        first_chunk_of_doc.setdefault(doc_id, chunk_id)
    kept: dict[str, RankedDocument] = {}
    dropped_over_limit = 0
    for position, tag in enumerate(tags):
        segment_end = tags[position + 1].start() if position + 1 < len(tags) else len(text)
        segment = text[tag.end():segment_end]
        closing = _SEGMENT_END.search(segment)
        if closing:
            segment = segment[: closing.start()]
        id_match = _ID_ATTRIBUTE.search(tag.group(1))
        raw_id = next((g for g in id_match.groups() if g is not None), "").strip() if id_match else ""
        if not raw_id:
            parsed.errors.append(f"entry {position + 1}: <Document> without an id")
            continue
        doc_id, chunk_id = raw_id, None
        title = document_title(doc_id)
        if title is None and raw_id in chunk_docs:
            chunk_id, doc_id = raw_id, chunk_docs[raw_id]
            title = document_title(doc_id)
        if title is None:
            parsed.errors.append(f"entry {position + 1}: unknown document id {raw_id!r}")
            continue
        if doc_id in kept:
            continue
        if len(kept) >= max_docs:
            dropped_over_limit += 1
            continue
        justification_match = _JUSTIFICATION.search(segment)
        justification = _clean(justification_match.group(1) if justification_match else segment)
        kept[doc_id] = RankedDocument(
            doc_id=doc_id,
            chunk_id=chunk_id or first_chunk_of_doc.get(doc_id),
            title=title,
            justification=justification,
        )
    if dropped_over_limit:
        parsed.errors.append(f"{dropped_over_limit} documents beyond the limit of {max_docs} were dropped")
    parsed.documents = list(kept.values())
    return parsed


def format_id(identifier: str) -> str:
    """Ids are written bare when they are plain tokens, quoted otherwise (the parser reads both)."""
    if identifier and re.fullmatch(r"[\w.:\-]+", identifier):
        return identifier
    return '"' + identifier.replace('"', "'") + '"'


def format_final_answer(entries: Sequence[tuple[str, str]]) -> str:
    """The canonical answer text for (doc_id, justification) pairs, most relevant first."""
    return "\n".join(
        f"<Document id={format_id(doc_id)}><Justification>{justification.strip()}</Justification></Document>"
        for doc_id, justification in entries
    )
