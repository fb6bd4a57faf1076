"""The serving manifest: where a customer's served adapter runs and what it scored.

`{customer}/serving/manifest.json` in the artifact store. `served.json` (see `served_state`)
says *which* policy won the gate; the manifest says *where* it is being served (the vLLM server's
URL, the LoRA name it was loaded under, the tool-call parser) so the search service, a dashboard
or an operator can reach it without asking Dagster. It is rewritten on every deployment; the
history of what was served lives in `served.json`.
"""

from __future__ import annotations

import hashlib
import re

from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.adapter_record import AdapterRecord, lift_flat_fields
from core.layout import serving_manifest_key
from core.storage import ArtifactStore
from serving.served_state import ServedRecord, utc_now


def adapter_name(customer: str, adapter_path: str) -> str:
    """The LoRA name a customer's adapter is served under: `acme-1a2b3c4d`.

    Versioned by the adapter's path, so a newly promoted adapter loads beside the old one under
    a new name (vLLM refuses to load a name twice and caches adapters by name) and requests
    never reach a half-replaced adapter; the old name is unloaded after the switch.
    """
    digest = hashlib.sha256(adapter_path.encode("utf-8")).hexdigest()[:8]
    return f"{re.sub(r'[^a-z0-9-]', '-', customer.lower())}-{digest}"


class ServingManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    customer: str
    policy: str  # the promoted spec (`transformers:/path`, `heuristic`)
    adapter: AdapterRecord | None = None  # the served record's, for whoever loads it elsewhere
    adapter_name: str | None = None  # the `model` requests use on the server
    server_url: str | None = None  # OpenAI-compatible base URL, ending in /v1
    tool_call_parser: str | None = None
    metrics: dict[str, dict[str, float]] = Field(default_factory=dict)  # suite -> metric -> value
    created_at: str = Field(default_factory=utc_now)  # UTC ISO 8601

    _lift_flat_fields = model_validator(mode="before")(lift_flat_fields)

    def policy_spec(self) -> str:
        """The spec that reaches the served adapter: `openai:URL#NAME` when a server holds it, else the promoted one."""
        if self.server_url and self.adapter_name:
            return f"openai:{self.server_url}#{self.adapter_name}"
        return self.policy


def manifest_for(record: ServedRecord, server_url: str | None = None, tool_call_parser: str | None = None) -> ServingManifest:
    """The manifest of `record` served by the vLLM server at `server_url` (None: not on a server)."""
    name = adapter_name(record.customer, record.adapter.path) if record.adapter else None
    return ServingManifest(
        customer=record.customer, policy=record.policy, adapter=record.adapter, adapter_name=name,
        server_url=server_url if name else None,
        tool_call_parser=tool_call_parser if name else None, metrics=record.metrics,
    )


def write_manifest(store: ArtifactStore, manifest: ServingManifest) -> str:
    """Write the manifest; returns its URI (for the asset's metadata)."""
    key = serving_manifest_key(manifest.customer)
    store.write_text(key, manifest.model_dump_json(indent=2) + "\n")
    return store.uri(key)


def load_manifest(store: ArtifactStore, customer: str) -> ServingManifest | None:
    key = serving_manifest_key(customer)
    if not store.exists(key):
        return None
    return store.read_record(key, ServingManifest.model_validate)
