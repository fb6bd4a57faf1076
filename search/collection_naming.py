"""Chroma collection names: one collection per customer, embedding model and chunker signature.

Why named this way: customers are hard-partitioned at build time (a query can never reach
another customer's vectors, with no filter to forget), and a changed model or chunker builds a
*new* collection instead of mixing incomparable vectors. Bump `INDEX_FORMAT_VERSION` when what
a collection stores changes meaning.
"""

from __future__ import annotations

import hashlib
import re

INDEX_FORMAT_VERSION = "1"


def _slug(text: str, limit: int) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug[:limit].strip("-") or "x"


def collection_name(customer: str, embedding_model: str, chunker: str) -> str:
    """`<customer>-<model>-<hash>`: readable, valid for Chroma ([a-zA-Z0-9._-], 3-512 chars),
    and different whenever the customer, the embedding model or the chunker signature is."""
    digest = hashlib.sha256(f"{customer}\x00{embedding_model}\x00{chunker}\x00{INDEX_FORMAT_VERSION}".encode()).hexdigest()[:12]
    return f"{_slug(customer, 48)}-{_slug(embedding_model, 32)}-{digest}"
