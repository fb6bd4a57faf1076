"""Shared tiny fixtures for training tests: a tiny random model folder and a tiny search backend.

`tiny_model_dir(tmp_path_factory)` builds (once per test session and seed) a random Llama with
a tokenizer trained on the harness's own prompt and tool texts, so views tokenize compactly
and SFT/RL steps take milliseconds. `TinyBackend` is an in-memory `SearchBackend` over a few
hand-written documents (term-overlap search, regex grep): a fake that honours the interface,
so episodes run through the real harness without Chroma or an embedding model.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Collection

from search.backend import Hit

TINY_DOCS: dict[str, tuple[str, list[str]]] = {
    "lighthouse": ("Alpha Lighthouse", [
        "The Alpha Lighthouse stands on Corven Point. It was designed by the engineer Mara Quell in 1901.",
        "Visitors climb 212 steps to reach the lantern room of the Alpha Lighthouse.",
    ]),
    "quell": ("Mara Quell", [
        "Mara Quell later moved to Lisbon, where she taught harbour engineering until 1930.",
        "Quell was born in Corven and studied in Glasgow.",
    ]),
    "river": ("Corven River", [
        "The Corven River rises in the Tallis Hills and flows into the Grey Sea near Corven Point.",
    ]),
    "railway": ("Tallis Railway", [
        "The Tallis Railway connected the Tallis Hills to the coast from 1888 to 1962.",
    ]),
}

_BUILT: dict[int, Path] = {}
_WORD = re.compile(r"\w+")


def tiny_vocab_texts() -> list[str]:
    """Texts the tiny tokenizer is trained on: prompts, tool schemas and the tiny documents."""
    from agent.prompts import FORCE_FINAL, SOFT_HINT, SYSTEM_PROMPT, USAGE_LINE, tool_schemas

    docs = [text for _, texts in TINY_DOCS.values() for text in texts]
    return [SYSTEM_PROMPT, FORCE_FINAL, SOFT_HINT, USAGE_LINE, json.dumps(tool_schemas()), *docs]


def tiny_model_dir(tmp_path_factory, seed: int = 0) -> Path:
    """A tiny random model folder, built once per session and seed (treat it as read-only)."""
    if seed not in _BUILT:
        from agent.small_model import build_tiny_model

        folder = tmp_path_factory.mktemp(f"tiny-model-{seed}") / "model"
        _BUILT[seed] = build_tiny_model(folder, tiny_vocab_texts(), seed=seed)
    return _BUILT[seed]


class TinyBackend:
    """In-memory `SearchBackend`: search ranks chunks by shared words, grep is a regex scan."""

    def __init__(self, docs: dict[str, tuple[str, list[str]]] | None = None):
        self.docs = docs or TINY_DOCS
        self.hits = [
            Hit(chunk_id=f"{doc_id}-{i}", doc_id=doc_id, title=title, text=text, score=0.0, n_tokens=len(text.split()), rank=i)
            for doc_id, (title, texts) in self.docs.items() for i, text in enumerate(texts)
        ]

    def search(self, query: str, k: int = 50, exclude: Collection[str] = ()) -> list[Hit]:
        terms = {w.lower() for w in _WORD.findall(query)}
        scored = [(len(terms & {w.lower() for w in _WORD.findall(h.text)}), -i, h) for i, h in enumerate(self.hits)]
        ranked = [h for score, _, h in sorted(scored, key=lambda s: (s[0], s[1]), reverse=True) if score > 0]
        return [h for h in ranked if h.chunk_id not in exclude][:k]

    search_bm25 = search
    search_dense = search

    def grep(self, pattern: str, limit: int = 5, exclude: Collection[str] = ()) -> list[Hit]:
        try:
            regex = re.compile(pattern)
        except re.error as error:
            raise ValueError(f"invalid pattern: {error}") from None
        return [h for h in self.hits if regex.search(h.text) and h.chunk_id not in exclude][:limit]

    def document_chunks(self, doc_id: str) -> list[Hit]:
        return [h for h in self.hits if h.doc_id == doc_id]

    def document_title(self, doc_id: str) -> str | None:
        entry = self.docs.get(doc_id)
        return entry[0] if entry else None
