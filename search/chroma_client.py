"""Chroma clients, one factory per deployment mode.

Embedded `PersistentClient` is the offline default (a folder under `$SEARCHSMITH_HOME`);
`HttpClient` talks to a `chroma run` server shared by workers; `CloudClient` talks to Chroma
Cloud. The index code is the same for all three: it only uses collection calls common to them.
Telemetry is always off (offline machines, and no customer metadata leaves the process).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CHROMA_MODES = ("embedded", "http", "cloud")
# Chroma caches one system per folder in a process-wide dict that two threads opening the same
# folder at once race on (a KeyError from `SharedSystemClient`); opening takes turns.
_OPEN_LOCK = threading.Lock()


def _settings():
    from chromadb.config import Settings

    return Settings(anonymized_telemetry=False)


def persistent_client(path: str | Path):
    """Embedded Chroma storing its files under `path` (created if missing)."""
    import chromadb

    path = Path(path).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    with _OPEN_LOCK:
        return chromadb.PersistentClient(path=str(path), settings=_settings())


def http_client(host: str = "127.0.0.1", port: int = 8000, ssl: bool = False, headers: dict[str, str] | None = None):
    """A `chroma run --host H --port P --path DIR` server."""
    import chromadb

    return chromadb.HttpClient(host=host, port=int(port), ssl=ssl, headers=headers, settings=_settings())


def cloud_client(api_key_env: str = "CHROMA_API_KEY", tenant: str | None = None, database: str | None = None):
    """Chroma Cloud; the API key comes from the environment variable `api_key_env`."""
    import chromadb

    api_key = os.environ.get(api_key_env)
    if not api_key:
        raise RuntimeError(f"Chroma Cloud needs an API key in ${api_key_env}")
    return chromadb.CloudClient(tenant=tenant, database=database, api_key=api_key, settings=_settings())


def make_client(mode: str = "embedded", **options: Any):
    """Dispatch on `mode`: `embedded` (path), `http` (host, port, ssl, headers), `cloud`
    (api_key_env, tenant, database)."""
    if mode in ("embedded", "persistent", "local"):
        return persistent_client(options["path"])
    if mode in ("http", "server"):
        return http_client(
            options.get("host", "127.0.0.1"), int(options.get("port", 8000)), bool(options.get("ssl", False)), options.get("headers")
        )
    if mode == "cloud":
        return cloud_client(options.get("api_key_env", "CHROMA_API_KEY"), options.get("tenant"), options.get("database"))
    raise ValueError(f"unknown Chroma mode {mode!r} (embedded | http | cloud)")


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def chroma_settings_from_env(environ: Mapping[str, str]) -> dict:
    """The Chroma deployment `SEARCHSMITH_CHROMA_*` names (orchestration.deployment lists them):
    embedded when unset; a bad value is an error naming the variable."""
    mode = environ.get("SEARCHSMITH_CHROMA_MODE", "").strip() or "embedded"
    if mode not in CHROMA_MODES:
        raise ValueError(f"SEARCHSMITH_CHROMA_MODE={mode!r}: expected one of {', '.join(CHROMA_MODES)}")
    if mode == "embedded":
        return {"mode": "embedded"}
    if mode == "cloud":
        return {"mode": "cloud", "tenant": environ.get("SEARCHSMITH_CHROMA_TENANT") or None,
                "database": environ.get("SEARCHSMITH_CHROMA_DATABASE") or None}
    host = environ.get("SEARCHSMITH_CHROMA_HOST", "").strip()
    if not host:
        raise ValueError("SEARCHSMITH_CHROMA_MODE=http needs SEARCHSMITH_CHROMA_HOST")
    port = environ.get("SEARCHSMITH_CHROMA_PORT", "8000")
    if not port.isdigit():
        raise ValueError(f"SEARCHSMITH_CHROMA_PORT={port!r} is not a port number")
    return {"mode": "http", "host": host, "port": int(port), "ssl": _flag(environ.get("SEARCHSMITH_CHROMA_SSL", ""))}


def default_chroma_path() -> Path:
    """The embedded deployment's folder: `$SEARCHSMITH_HOME/chroma`."""
    from core.registry import searchsmith_home

    return searchsmith_home() / "chroma"


def index_cache_dir() -> Path:
    """Local working copies of BM25 folders (the artifact store holds the durable copy)."""
    from core.registry import searchsmith_home

    path = searchsmith_home() / "index-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path
