"""Dagster resources: thin configurable wrappers that hand plain clients to the stage code."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from core.config import CustomerConfig
from core.registry import CustomerRegistry, searchsmith_home
from core.storage import ArtifactStore, open_store


class ArtifactStoreResource(dg.ConfigurableResource):
    """`location`: a local folder or `s3://bucket/prefix`; empty means `$SEARCHSMITH_HOME/artifacts`."""

    location: str = ""
    endpoint_url: str | None = None
    _store: ArtifactStore | None = PrivateAttr(default=None)

    def get(self) -> ArtifactStore:
        if self._store is None:
            self._store = open_store(self.location or str(searchsmith_home() / "artifacts"), self.endpoint_url)
        return self._store


class CustomersResource(dg.ConfigurableResource):
    """Finds customer files; `folder` empty means `customers/` beside the code or in the working directory.
    Files are validated whole (every stage section) when loaded, so an asset never starts on a
    file that a later stage would reject."""

    folder: str = ""
    home: str = ""

    def registry(self) -> CustomerRegistry:
        return CustomerRegistry(
            home=Path(self.home) if self.home else None,
            folder=Path(self.folder) if self.folder else None,
        )

    def get(self, name: str) -> CustomerConfig:
        return self.registry().get(name)

    def home_dir(self) -> Path:
        """`$SEARCHSMITH_HOME` (or `home`): work folders and trained models live under it."""
        return Path(self.home) if self.home else searchsmith_home()

    def work_dir(self, name: str, stage: str) -> Path:
        """A persistent scratch folder per customer and stage (git clones, index builds)."""
        path = self.home_dir() / "work" / name / stage
        path.mkdir(parents=True, exist_ok=True)
        return path


class ChromaResource(dg.ConfigurableResource):
    """One Chroma deployment for every customer: `embedded` (a folder), `http` (`chroma run`), `cloud`."""

    mode: str = "embedded"
    path: str = ""  # embedded: default $SEARCHSMITH_HOME/chroma
    host: str = "127.0.0.1"
    port: int = 8000
    ssl: bool = False
    api_key_env: str = "CHROMA_API_KEY"
    tenant: str | None = None
    database: str | None = None
    _client: object | None = PrivateAttr(default=None)

    def client(self):
        from search.chroma_client import make_client

        if self._client is None:
            self._client = make_client(
                self.mode,
                path=self.path or str(searchsmith_home() / "chroma"),
                host=self.host,
                port=self.port,
                ssl=self.ssl,
                api_key_env=self.api_key_env,
                tenant=self.tenant,
                database=self.database,
            )
        return self._client

    def cache_dir(self) -> Path:
        """Local working copies of BM25 folders (the artifact store holds the durable copy)."""
        path = searchsmith_home() / "index-cache"
        path.mkdir(parents=True, exist_ok=True)
        return path


class LLMResource(dg.ConfigurableResource):
    """Clients for a customer's `teacher:` endpoint (`llm.client.LLMClient`): endpoint, model,
    key variable, timeout, retries and concurrency come from the customer file, shared limits
    (backoff, sampling temperature for generation) from here. Two instances of this class are
    defined: `teacher_llm` (task generation, replies cached in the artifact store) and
    `policy_llm` (the teacher as a tool-calling policy for SFT trajectories)."""

    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    temperature: float = 0.7

    def for_customer(self, config: CustomerConfig):
        """None when the customer has no teacher endpoint (the offline generators are used)."""
        from llm.client import LLMClient

        teacher = config.teacher
        if teacher is None:
            return None
        return LLMClient(
            base_url=teacher.base_url,
            model=teacher.model,
            api_key_env=teacher.api_key_env,
            timeout_s=teacher.timeout_s,
            max_retries=teacher.max_retries,
            concurrency=teacher.concurrency,
            backoff_s=self.backoff_s,
            backoff_max_s=self.backoff_max_s,
            temperature=self.temperature,
        )
