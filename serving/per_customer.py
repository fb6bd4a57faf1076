"""From a benchmark report to what a customer is served: the gate, the served state, the vLLM
server that holds the adapter, and the policy the search service runs.

Why one module: `served_model` (the asset), `searchsmith serve [--rollback]` and the search
service must agree on every step: a promotion persists the record, deploys it (loads the adapter
into the customer's vLLM server when one is configured) and rewrites the serving manifest; a
rollback does the same for the record it restores; the service asks `served_policy` which spec
to run. Dagster-free: the asset and the CLI call these.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.policy_spec import RERANK_SUFFIX
from core.layout import benchmark_summary_key, serving_manifest_key
from core.serving_settings import ServingSettings
from core.storage import ArtifactStore
from llm.vllm_admin import VLLMAdmin
from serving.promotion import PromotionDecision, decide, record_for
from serving.served_state import NOTHING_SERVED_POLICY, ServedRecord, load_served, promote, rollback
from serving.serving_manifest import ServingManifest, load_manifest, manifest_for, write_manifest
from serving.vllm_server import tool_call_parser_for

if TYPE_CHECKING:
    from search.reranker import Reranker

LOG = logging.getLogger(__name__)


def load_benchmark_results(store: ArtifactStore, customer: str) -> dict[str, dict[str, dict[str, Any]]]:
    key = benchmark_summary_key(customer)
    if not store.exists(key):
        raise FileNotFoundError(f"no benchmark results for {customer!r}: materialize benchmark_report first")
    return json.loads(store.read_text(key))


@dataclass
class ServingOutcome:
    """What `served_model` / `searchsmith serve` report."""

    promoted: bool
    reason: str
    served: ServedRecord | None
    manifest: ServingManifest | None
    decision: PromotionDecision | None = None
    action: str = "promote"  # promote | rollback

    def to_dict(self) -> dict[str, Any]:
        served = None
        if self.served is not None:
            served = {"policy": self.served.policy, "adapter_path": self.served.adapter_path, "base_model": self.served.base_model,
                      "metrics": self.served.metrics, "promoted_at": self.served.promoted_at}
        return {
            "promoted": self.promoted, "reason": self.reason, "action": self.action,
            "served": served or {"policy": NOTHING_SERVED_POLICY, "adapter_path": None, "metrics": {}},
            "serving": self.manifest.model_dump() if self.manifest else None,
            "decision": self.decision.model_dump(mode="json") if self.decision else None,
        }


def deploy(store: ArtifactStore, record: ServedRecord | None, customer: str, settings: ServingSettings) -> ServingManifest | None:
    """Make `record` reachable: load its adapter into the customer's vLLM server (when configured),
    unload the customer's previous adapter there, and rewrite the serving manifest."""
    previous = load_manifest(store, customer)
    if record is None:
        if previous is not None:
            store.delete(serving_manifest_key(customer))
        return None
    parser = settings.tool_call_parser
    if parser is None and record.base_model:
        try:
            parser = tool_call_parser_for(record.base_model)
        except ValueError:
            parser = None
    url = settings.vllm_url.rstrip("/") if settings.vllm_url and record.adapter_path else None
    if url is not None and not url.endswith("/v1"):
        url += "/v1"
    manifest = manifest_for(record, server_url=url, tool_call_parser=parser)
    if url is not None and manifest.adapter_name:
        client = VLLMAdmin(url, api_key_env=settings.vllm_api_key_env)
        loaded = client.models()
        if manifest.adapter_name not in loaded:
            seconds = client.load_adapter(manifest.adapter_name, record.adapter_path)
            LOG.info("loaded %s into %s in %.2fs", manifest.adapter_name, url, seconds)
        old = previous.adapter_name if previous is not None and previous.server_url == url else None
        if old and old != manifest.adapter_name and old in loaded:
            client.unload_adapter(old)
    write_manifest(store, manifest)
    return manifest


def promote_best(store: ArtifactStore, customer: str, settings: ServingSettings,
                 results: dict[str, dict[str, dict[str, Any]]] | None = None) -> ServingOutcome:
    """Run the gate on the customer's latest benchmark results; promote and deploy the winner.
    A rejected candidate leaves the served record and the manifest untouched."""
    results = results if results is not None else load_benchmark_results(store, customer)
    served = load_served(store, customer)
    decision = decide(results, served, settings.promotion)
    if not decision.promoted:
        return ServingOutcome(False, decision.reason, served, load_manifest(store, customer), decision)
    record = record_for(customer, decision)
    manifest = deploy(store, record, customer, settings)
    promote(store, customer, record)  # only once it is reachable: a failed deploy serves the old one
    return ServingOutcome(True, decision.reason, record, manifest, decision)


def rollback_served(store: ArtifactStore, customer: str, settings: ServingSettings) -> ServingOutcome:
    """Restore the previously served record (nothing served: the heuristic) and redeploy it."""
    leaving = load_served(store, customer)
    restored = rollback(store, customer)
    manifest = deploy(store, restored, customer, settings)
    target = restored.policy if restored else f"nothing served (the {NOTHING_SERVED_POLICY} policy)"
    reason = f"rolled back from {leaving.policy if leaving else 'nothing'} to {target}"
    return ServingOutcome(False, reason, restored, manifest, None, action="rollback")


def current_serving(store: ArtifactStore, customer: str) -> ServingOutcome:
    served = load_served(store, customer)
    reason = f"serving {served.policy}" if served else f"nothing promoted yet: the {NOTHING_SERVED_POLICY} policy answers"
    return ServingOutcome(False, reason, served, load_manifest(store, customer), None, action="status")


def served_policy(store: ArtifactStore, customer: str) -> str:
    """The spec the search service runs: the vLLM-served adapter when the manifest places it on
    a server, the promoted spec in-process otherwise, the heuristic when nothing is served."""
    served = load_served(store, customer)
    if served is None:
        return NOTHING_SERVED_POLICY
    manifest = load_manifest(store, customer)
    if manifest is not None and manifest.policy == served.policy:
        selection = RERANK_SUFFIX if served.policy.endswith(RERANK_SUFFIX) and manifest.server_url else ""
        return manifest.policy_spec() + selection
    return served.policy


def customer_reranker(store: ArtifactStore, customer: str) -> Reranker | None:
    """The customer's trained reranker, for a served `POLICY+rerank` (None before
    `reranker_checkpoint` has run); its model is loaded once per process and folder."""
    from search.reranker import Reranker
    from training.per_customer import local_reranker, read_reranker

    checkpoint = read_reranker(store, customer)
    return Reranker.load(local_reranker(store, checkpoint)) if checkpoint is not None else None


def served_checkpoint(store: ArtifactStore, customer: str) -> str | None:
    """The promoted spec itself (`transformers:ADAPTER` for a checkpoint), whichever way the service
    reaches it: its adapter's sidecar holds the harness profile the service must run it under."""
    served = load_served(store, customer)
    return served.policy if served is not None else None
