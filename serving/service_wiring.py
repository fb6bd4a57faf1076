"""What the search service needs from a deployment, built without Dagster.

`searchsmith api` runs where only the service is installed (no Dagster, no torch): the artifact
store, the Chroma deployment and the customers folder come from the same `SEARCHSMITH_*`
variables the pipeline's resources read (`core.storage.default_store_location`,
`search.chroma_client.chroma_settings_from_env`), so the pipeline and the service agree on
where everything is without sharing a process. The CLI and the demo pass the clients their
Dagster resources built; `from_environment` builds them for the standalone service.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from core.registry import CustomerRegistry, KnownCustomers
from core.storage import ArtifactStore, default_store_location, open_store
from search.chroma_client import chroma_settings_from_env, default_chroma_path, index_cache_dir, make_client
from search.per_customer import embedder_for, open_customer_index

if TYPE_CHECKING:
    from serving.api import ApiLimits


def service_wiring(store: ArtifactStore, chroma_client: Any, cache_dir: Path, registry: CustomerRegistry | None = None) -> dict[str, Any]:
    """`create_app`/`serve_api` keyword arguments: customers, their indexes, served policies, rerankers."""
    from serving.api import IndexUnavailable
    from serving.per_customer import customer_reranker, served_checkpoint, served_policy

    registry = registry or CustomerRegistry()

    def open_index(customer: str):
        embedder = embedder_for(registry.get(customer).embedding)
        try:
            return open_customer_index(customer, store, chroma_client, embedder, cache_dir)
        except LookupError as error:
            raise IndexUnavailable(f"no index for customer {customer!r} yet: run `searchsmith sync {customer}` first ({error})") from None

    return {"known_customers": KnownCustomers(registry).names, "open_index": open_index,
            "policy_for": lambda customer: served_policy(store, customer),
            "profile_for": lambda customer: served_checkpoint(store, customer),
            "reranker_for": lambda customer: customer_reranker(store, customer)}


def from_environment() -> dict[str, Any]:
    """The wiring of a standalone service: store, Chroma and customers from `SEARCHSMITH_*`."""
    chroma = chroma_settings_from_env(os.environ)
    client = make_client(chroma.pop("mode"), path=str(default_chroma_path()), **chroma)
    return service_wiring(open_store(default_store_location()), client, index_cache_dir())


def api_limits(timeout_s: float = 60.0, workers: int = 4, queue: int = 64) -> ApiLimits:
    """The service's limits from `searchsmith api`'s flags; a bad one is a ValueError naming the flag
    (checked before anything is printed or bound, so a bad flag gets its error alone)."""
    from serving.api import ApiLimits

    bad = [problem for problem, wrong in ((f"--timeout {timeout_s:g} must be positive (seconds)", timeout_s <= 0),
                                          (f"--workers {workers} must be at least 1", workers < 1),
                                          (f"--queue {queue} cannot be negative", queue < 0)) if wrong]
    if bad:
        raise ValueError("; ".join(bad))
    return ApiLimits(search_timeout_s=timeout_s, max_concurrent_searches=workers, max_queued_searches=queue)


def serve_search_api(host: str, port: int, limits: ApiLimits) -> None:
    """`searchsmith api`: serve until interrupted."""
    from serving.api import serve_api

    serve_api(host, port, limits=limits, **from_environment())
