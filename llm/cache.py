"""A content-addressed cache of teacher replies in the artifact store.

Why content-addressed: the key is the sha256 of everything that determines a reply (model,
messages, tools, response format, sampling params and the caller's attempt number), so a rerun
of a materialization finds every answer it already paid for, a crashed run resumes where it
stopped, and two customers asking the same question share nothing by accident (the prefix is
the caller's, normally `{customer}/synth/llm_cache`). Only successful HTTP replies are stored:
a 500 or a timeout is retried on the next run, a malformed-but-delivered reply is stored (it
was paid for) and the caller asks again with `attempt + 1`, which is a different key.

Entries are small JSON files written atomically by the store; a corrupt entry is treated as a
miss and overwritten, never trusted.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from core.storage import ArtifactNotFound, ArtifactStore

CACHE_FORMAT = "1"


def cache_key(payload: dict[str, Any]) -> str:
    body = json.dumps({"format": CACHE_FORMAT, **payload}, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


class ResponseCache:
    def __init__(self, store: ArtifactStore, prefix: str = "llm_cache"):
        self.store = store
        self.prefix = prefix.strip("/")

    def _path(self, key: str) -> str:
        return f"{self.prefix}/{key[:2]}/{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            raw = self.store.read_bytes(self._path(key))
        except ArtifactNotFound:
            return None
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        self.store.write_bytes(self._path(key), json.dumps(value, ensure_ascii=False).encode("utf-8"))

    def __contains__(self, key: str) -> bool:
        return self.store.exists(self._path(key))
