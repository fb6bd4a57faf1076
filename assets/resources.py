"""Dagster resources: thin configurable wrappers that hand plain clients to the stage code.

Defaults are read from the environment when a client is first built (a run, a sensor tick, the
CLI), never when the code location is imported: `dagster api grpc` loads the same definitions
for every deployment, and a deployment's variables are the ones its processes run with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from core.config import CustomerConfig
from core.registry import CustomerRegistry, searchsmith_home
from core.storage import ArtifactStore, default_store_location, open_store
from search.chroma_client import chroma_settings_from_env, default_chroma_path, index_cache_dir


class ArtifactStoreResource(dg.ConfigurableResource):
    """`location`: a local folder or `s3://bucket/prefix`; empty means `$SEARCHSMITH_ARTIFACTS`,
    else `$SEARCHSMITH_HOME/artifacts`."""

    location: str = ""
    endpoint_url: str | None = None
    _store: ArtifactStore | None = PrivateAttr(default=None)

    def get(self) -> ArtifactStore:
        if self._store is None:
            self._store = open_store(self.location or default_store_location(), self.endpoint_url)
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
    """One Chroma deployment for every customer: `embedded` (a folder), `http` (`chroma run`), `cloud`;
    `mode` empty: the one `SEARCHSMITH_CHROMA_*` names (`chroma_settings_from_env`), embedded when unset."""

    mode: str = ""
    path: str = ""  # embedded: default $SEARCHSMITH_HOME/chroma
    host: str = "127.0.0.1"
    port: int = 8000
    ssl: bool = False
    api_key_env: str = "CHROMA_API_KEY"
    tenant: str | None = None
    database: str | None = None
    _client: object | None = PrivateAttr(default=None)

    def resolved(self, environ: Mapping[str, str] | None = None) -> ChromaResource:
        """This resource with an empty `mode` filled in from the environment."""
        if self.mode:
            return self
        return ChromaResource(**{**self.model_dump(exclude={"mode"}), **chroma_settings_from_env(os.environ if environ is None else environ)})

    def client(self):
        from search.chroma_client import make_client

        if self._client is None:
            settings = self.resolved()
            self._client = make_client(
                settings.mode,
                path=settings.path or str(default_chroma_path()),
                host=settings.host,
                port=settings.port,
                ssl=settings.ssl,
                api_key_env=settings.api_key_env,
                tenant=settings.tenant,
                database=settings.database,
            )
        return self._client

    def cache_dir(self) -> Path:
        return index_cache_dir()


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


@dataclass(frozen=True)
class PipelineResources:
    """The resources every Searchsmith process uses, built in one place: the code location hands
    them to Dagster (`as_dagster`), the CLI and the search service use the same objects directly
    (a command is not a run, and reaching into the definitions for them hid which one it used)."""

    store: ArtifactStoreResource
    customers: CustomersResource
    chroma: ChromaResource
    teacher_llm: LLMResource
    policy_llm: LLMResource

    def as_dagster(self) -> dict[str, dg.ConfigurableResource]:
        return {"store": self.store, "customers": self.customers, "chroma": self.chroma,
                "teacher_llm": self.teacher_llm, "policy_llm": self.policy_llm}


def pipeline_resources() -> PipelineResources:
    """Nothing is read from the environment or the customers folder here: each resource reads
    SEARCHSMITH_* when a run, a sensor tick or the CLI first builds a client."""
    return PipelineResources(
        store=ArtifactStoreResource(),
        customers=CustomersResource(),
        chroma=ChromaResource(),  # embedded unless SEARCHSMITH_CHROMA_MODE says otherwise
        teacher_llm=LLMResource(temperature=0.7),  # task generation samples for variety
        policy_llm=LLMResource(temperature=0.0),  # the teacher policy sets its own sampling per request
    )
