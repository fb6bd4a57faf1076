"""Which external systems the code location talks to, read from the environment when it loads.

Unset, everything is the embedded default `make demo` uses (artifacts and Chroma under
$SEARCHSMITH_HOME). A deployment (deploy/compose.yaml, deploy/helm/values.yaml) sets:

| variable | meaning |
|---|---|
| `SEARCHSMITH_ARTIFACTS` | a folder or `s3://bucket/prefix` for every artifact |
| `AWS_ENDPOINT_URL_S3` | an S3-compatible endpoint (SeaweedFS, MinIO); boto3 reads it itself |
| `SEARCHSMITH_CHROMA_MODE` | `embedded` (default), `http` (a `chroma run` server) or `cloud` |
| `SEARCHSMITH_CHROMA_HOST`, `SEARCHSMITH_CHROMA_PORT`, `SEARCHSMITH_CHROMA_SSL` | the server, for `http` |
| `SEARCHSMITH_CHROMA_TENANT`, `SEARCHSMITH_CHROMA_DATABASE`, `CHROMA_API_KEY` | Chroma Cloud, for `cloud` |
| `SEARCHSMITH_CUSTOMERS_DIR` | the folder of customer files (read by core.registry) |
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from assets.resources import ChromaResource

CHROMA_MODES = ("embedded", "http", "cloud")
# What the code reads, for the deployment files' tests: every name here is set by them.
ENV_VARS = (
    "SEARCHSMITH_ARTIFACTS",
    "SEARCHSMITH_CHROMA_MODE",
    "SEARCHSMITH_CHROMA_HOST",
    "SEARCHSMITH_CHROMA_PORT",
    "SEARCHSMITH_CUSTOMERS_DIR",
    "SEARCHSMITH_HOME",
)


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def chroma_from_env(environ: Mapping[str, str] = os.environ) -> ChromaResource:
    mode = environ.get("SEARCHSMITH_CHROMA_MODE", "").strip() or "embedded"
    if mode not in CHROMA_MODES:
        raise ValueError(f"SEARCHSMITH_CHROMA_MODE={mode!r}: expected one of {', '.join(CHROMA_MODES)}")
    if mode == "embedded":
        return ChromaResource()
    if mode == "cloud":
        return ChromaResource(mode="cloud", tenant=environ.get("SEARCHSMITH_CHROMA_TENANT") or None,
                              database=environ.get("SEARCHSMITH_CHROMA_DATABASE") or None)
    host = environ.get("SEARCHSMITH_CHROMA_HOST", "").strip()
    if not host:
        raise ValueError("SEARCHSMITH_CHROMA_MODE=http needs SEARCHSMITH_CHROMA_HOST")
    port = environ.get("SEARCHSMITH_CHROMA_PORT", "8000")
    if not port.isdigit():
        raise ValueError(f"SEARCHSMITH_CHROMA_PORT={port!r} is not a port number")
    return ChromaResource(mode="http", host=host, port=int(port), ssl=_flag(environ.get("SEARCHSMITH_CHROMA_SSL", "")))

