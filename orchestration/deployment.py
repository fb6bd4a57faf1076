"""Which external systems the code location talks to, read from the environment when a client is built.

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

# What the code reads, for the deployment files' tests: every name here is set by them.
ENV_VARS = (
    "SEARCHSMITH_ARTIFACTS",
    "SEARCHSMITH_CHROMA_MODE",
    "SEARCHSMITH_CHROMA_HOST",
    "SEARCHSMITH_CHROMA_PORT",
    "SEARCHSMITH_CUSTOMERS_DIR",
    "SEARCHSMITH_HOME",
)


def chroma_from_env(environ: Mapping[str, str] = os.environ) -> ChromaResource:
    """The Chroma resource a deployment's environment names (what the code location uses when a
    run, a sensor or the CLI first builds a client)."""
    return ChromaResource().resolved(environ)
