"""Dagster resources: thin configurable wrappers that hand plain clients to the stage code."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
from pydantic import PrivateAttr

from corpus.config import CustomerConfig
from corpus.registry import CustomerRegistry, searchsmith_home
from corpus.storage import ArtifactStore, open_store


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
    """Finds customer files; `folder` empty means `customers/` beside the code or in the working directory."""

    folder: str = ""
    home: str = ""

    def registry(self) -> CustomerRegistry:
        return CustomerRegistry(
            home=Path(self.home) if self.home else None,
            folder=Path(self.folder) if self.folder else None,
        )

    def get(self, name: str) -> CustomerConfig:
        return self.registry().get(name)

    def work_dir(self, name: str, stage: str) -> Path:
        """A persistent scratch folder per customer and stage (git clones, index builds)."""
        root = Path(self.home) if self.home else searchsmith_home()
        path = root / "work" / name / stage
        path.mkdir(parents=True, exist_ok=True)
        return path
