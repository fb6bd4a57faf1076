"""From a benchmark report to what a customer is served: the gate, the served state, the vLLM
server that holds the adapter, and the policy the search service runs.

Why one module: `served_model` (the asset), `searchsmith serve [--rollback]` and the search
service must agree on every step: a promotion persists the record, deploys it (loads the adapter
into the customer's vLLM server when one is configured) and rewrites the serving manifest; a
rollback does the same for the record it restores; the service asks `served_policy` which spec
to run. Dagster-free: the asset and the CLI call these.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.policy_spec import RERANK_SUFFIX, PolicySpec
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
    return store.read_record(key, dict)


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
            adapter = self.served.adapter
            served = {"policy": self.served.policy, "adapter_path": adapter.path if adapter else None,
                      "base_model": adapter.base_model if adapter else None, "adapter": adapter.model_dump() if adapter else None,
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
    if parser is None and record.adapter is not None and record.adapter.base_model:
        try:
            parser = tool_call_parser_for(record.adapter.base_model)
        except ValueError:
            parser = None
    url = settings.vllm_url.rstrip("/") if settings.vllm_url and record.adapter else None
    if url is not None and not url.endswith("/v1"):
        url += "/v1"
    manifest = manifest_for(record, server_url=url, tool_call_parser=parser)
    if url is not None and manifest.adapter_name and record.adapter is not None:
        client = VLLMAdmin(url, api_key_env=settings.vllm_api_key_env)
        loaded = client.models()
        if manifest.adapter_name not in loaded:
            # vLLM reads the folder from its own disk: on a single host (or a shared volume) this
            # brings it there when another worker trained it; a separate vLLM host pulls it itself
            # (`serving.vllm_server.plan_servers(records, store)`).
            folder = record.adapter.local_folder(store)
            seconds = client.load_adapter(manifest.adapter_name, str(folder))
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
    from training.per_customer import checkpoint_adapters

    record = record_for(customer, decision, published=checkpoint_adapters(store, customer))
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


def served_policy(store: ArtifactStore, customer: str) -> PolicySpec:
    """The spec the search service runs: the vLLM-served adapter when the manifest places it on
    a server, the promoted spec in-process otherwise, the heuristic when nothing is served."""
    served = load_served(store, customer)
    if served is None:
        return PolicySpec.parse(NOTHING_SERVED_POLICY)
    _bring_adapter_here(store, served)
    manifest = load_manifest(store, customer)
    if manifest is not None and manifest.policy == served.policy:
        selection = RERANK_SUFFIX if served.policy.endswith(RERANK_SUFFIX) and manifest.server_url else ""
        return PolicySpec.parse(manifest.policy_spec() + selection)
    return PolicySpec.parse(served.policy)


def customer_reranker(store: ArtifactStore, customer: str) -> Reranker | None:
    """The customer's trained reranker, for a served `POLICY+rerank` (None before
    `reranker_checkpoint` has run); its model is loaded once per process and folder."""
    from search.reranker import Reranker
    from training.per_customer import local_reranker, read_reranker

    checkpoint = read_reranker(store, customer)
    return Reranker.load(local_reranker(store, checkpoint)) if checkpoint is not None else None


def served_checkpoint(store: ArtifactStore, customer: str) -> PolicySpec | None:
    """The promoted spec itself (`transformers:ADAPTER` for a checkpoint), whichever way the service
    reaches it: its adapter's sidecar holds the harness profile the service must run it under."""
    served = load_served(store, customer)
    if served is None:
        return None
    _bring_adapter_here(store, served)
    return PolicySpec.parse(served.policy)


def _bring_adapter_here(store: ArtifactStore, served: ServedRecord) -> None:
    """Pull the served adapter from the artifact store when this machine did not train it (a
    search-service pod, a second host): the in-process policy loads its weights and the harness
    profile comes from its sidecar. Once pulled, this is a stat of two files per request."""
    if served.adapter is None:
        return
    try:
        served.adapter.local_folder(store)
    except FileNotFoundError as error:  # the policy loader reports it to the caller, naming the folder
        LOG.warning("customer %s: %s", served.customer, error)
