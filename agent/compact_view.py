"""The compact view for small models: per-episode references and short chunk renderings.

Why: a 135M-parameter student has an 8K window and learns from a few hundred episodes. In the
full Context-1 view one search shows two or three 200-token chunks behind long hexadecimal ids,
and a final answer is 500-600 tokens of `<Document id=...><Justification>` entries, which a
small model neither fits nor learns to copy. The compact view keeps everything else (the four
tools, budget, dedup, pruning, the trajectory schema) and changes only what the model reads and
writes: each chunk shown gets the next episode-wide reference number (`[3]`), is rendered as its
title plus the sentences that share the most words with the question, and the answer may be
references alone (`[3] [1] [7]`). Tools accept references where ids were expected; the harness
resolves them to chunk and document ids, so trajectories, rewards and metrics see real ids.

Simplifications: sentences are cut at `.`, `!` or `?` before a capital or digit; "best" is
question-term overlap with the chunk's first sentence always kept (for an encyclopedic chunk it
says what the subject is, which is what a bridge hop needs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.final_answer import ParsedAnswer, parse_final_answer
from agent.trajectory import RankedDocument

MAX_SENTENCES = 3
MAX_WORDS = 60

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
_WORD = re.compile(r"[A-Za-z0-9]+")
_REFERENCE = re.compile(r"\[\s*(\d{1,5})\s*\]")
_NUMBER = re.compile(r"(?<![\w.])(\d{1,5})(?![\w.])")


def best_sentences(text: str, question_terms: set[str], *, max_sentences: int = MAX_SENTENCES, max_words: int = MAX_WORDS) -> str:
    """The first sentence plus the sentences richest in question terms, in reading order, cut to `max_words`."""
    sentences = [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]
    if not sentences:
        return ""
    scored = sorted(range(1, len(sentences)), key=lambda i: (-len(question_terms.intersection(
        w.lower() for w in _WORD.findall(sentences[i]))), i))
    chosen = sorted([0, *scored[: max_sentences - 1]])
    words = " ".join(sentences[i] for i in chosen).split()
    return " ".join(words[:max_words]) + (" ..." if len(words) > max_words else "")


def render_compact_chunk(reference: int, title: str, text: str, question_terms: set[str]) -> str:
    title = " ".join(title.split()) or "untitled"
    return f"[{reference}] {title}: {best_sentences(_without_title_line(text, title), question_terms)}\n"


def _without_title_line(text: str, title: str) -> str:
    """The chunk text minus a first line that only repeats the title (`# Title` in Markdown
    sources): the rendering shows the title once already, and a small window has no tokens to spare."""
    first, newline, rest = text.lstrip().partition("\n")
    return rest if newline and " ".join(first.lstrip("# ").split()) == title else text


def pruned_reference_marker(reference: int) -> str:
    return f"[{reference}] (pruned)\n"


@dataclass
class References:
    """Episode-wide reference numbers, assigned in the order chunks are first shown."""

    by_chunk: dict[str, int] = field(default_factory=dict)
    chunks: list[str] = field(default_factory=list)  # reference n -> chunks[n - 1]

    def assign(self, chunk_id: str) -> int:
        if chunk_id not in self.by_chunk:
            self.chunks.append(chunk_id)
            self.by_chunk[chunk_id] = len(self.chunks)
        return self.by_chunk[chunk_id]

    def chunk(self, value: Any) -> str | None:
        """The chunk a reference names: `3`, `"3"`, `"[3]"`; a known chunk id passes through."""
        text = str(value).strip()
        if text in self.by_chunk:
            return text
        match = re.fullmatch(r"\[?\s*(\d{1,5})\s*\]?", text)
        if match and 1 <= int(match.group(1)) <= len(self.chunks):
            return self.chunks[int(match.group(1)) - 1]
        return None


def parse_reference_answer(
    text: str | None, references: References, chunk_docs: Mapping[str, str], *,
    document_title: Callable[[str], str | None], max_docs: int,
) -> ParsedAnswer:
    """Documents named by `[n]` references (or bare numbers) in order, deduplicated by document.

    An answer written in the full view's `<Document id=...>` form is read by that parser instead.
    """
    if text and "<document" in text.lower():
        return parse_final_answer(text, document_title=document_title, chunk_docs=chunk_docs, max_docs=max_docs)
    parsed = ParsedAnswer()
    if not text or not text.strip():
        parsed.errors.append("empty final answer")
        return parsed
    numbers = [int(m.group(1)) for m in _REFERENCE.finditer(text)] or [int(m.group(1)) for m in _NUMBER.finditer(text)]
    if not numbers:
        parsed.errors.append("no [n] references found in the final answer")
        return parsed
    kept: dict[str, RankedDocument] = {}
    for number in numbers:
        chunk_id = references.chunk(number)
        if chunk_id is None or chunk_id not in chunk_docs:
            parsed.errors.append(f"unknown reference [{number}]")
            continue
        doc_id = chunk_docs[chunk_id]
        if doc_id in kept:
            continue
        if len(kept) >= max_docs:
            parsed.errors.append(f"references beyond the limit of {max_docs} were dropped")
            break
        kept[doc_id] = RankedDocument(doc_id=doc_id, chunk_id=chunk_id, title=document_title(doc_id) or "")
    parsed.documents = list(kept.values())
    return parsed


def format_reference_answer(references: list[int]) -> str:
    return " ".join(f"[{n}]" for n in references)
