"""Run Dagster jobs in-process against the persistent instance, and read back their metadata."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import dagster as dg

from corpus.registry import CustomerRegistry
from orchestration.errors import CliError, JobFailed
from orchestration.partitions import customers_partitions


@lru_cache(maxsize=1)
def instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.get()


def register_partition(name: str) -> None:
    current = instance().get_dynamic_partitions(customers_partitions.name)
    if name not in current:
        instance().add_dynamic_partitions(customers_partitions.name, [name])


def _metadata_value(value: Any) -> Any:
    return getattr(value, "value", value)


def materialization_metadata(result: dg.ExecuteInProcessResult) -> dict[str, dict[str, Any]]:
    """Asset name -> its materialization metadata as plain Python values."""
    found: dict[str, dict[str, Any]] = {}
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        found[materialization.asset_key.to_user_string()] = {k: _metadata_value(v) for k, v in materialization.metadata.items()}
    return found


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    for event in result.all_events:
        if event.is_step_failure and event.step_failure_data and event.step_failure_data.error:
            error = event.step_failure_data.error
            cause = error.cause.message.strip() if error.cause else ""
            return f"step {event.step_key} failed: {error.message.strip()}" + (f" ({cause})" if cause else "")
    return "run failed"


def run_job(job_name: str, customer: str, tags: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    CustomerRegistry().get(customer)  # a clear error for an unknown customer before Dagster starts
    register_partition(customer)
    from orchestration.definitions import defs

    job = defs.resolve_job_def(job_name)
    result = job.execute_in_process(
        partition_key=customer, instance=instance(), raise_on_error=False, tags={"customer": customer, **(tags or {})}
    )
    if not result.success:
        raise JobFailed(f"{job_name} for {customer}: {failure_message(result)} (run {result.run_id})")
    return materialization_metadata(result)


def run_corpus_resync(customer: str) -> dict[str, Any]:
    metadata = run_job("corpus_resync", customer)
    documents = metadata.get("raw_documents", {})
    chunks = metadata.get("chunks", {})
    payload: dict[str, Any] = {"customer": customer}
    for key in ("added", "changed", "deleted", "unchanged", "quarantined"):
        payload[key] = int(documents.get(key, 0))
    payload["chunks"] = int(chunks.get("chunks", 0))
    payload["documents"] = int(documents.get("documents", 0))
    if "chroma_index" in metadata:
        payload["index"] = {k: metadata["chroma_index"][k] for k in ("embedded", "deleted", "collection") if k in metadata["chroma_index"]}
    return payload


def open_index(customer: str):
    """The customer's built index and its chunks (for fact-level gold)."""
    from orchestration.definitions import defs
    from corpus.stage import chunks_key
    from retrieval.customer_index import embedder_for, open_customer_index

    config = CustomerRegistry().get(customer)
    store, chroma = defs.resources["store"].get(), defs.resources["chroma"]
    embedder = embedder_for(config.embedding)
    try:
        index = open_customer_index(customer, store, chroma.client(), embedder, chroma.cache_dir())
    except LookupError as error:
        raise CliError(f"no index for customer {customer!r} yet: run `searchsmith sync {customer}` first ({error})") from None
    return index, store.read_parquet(chunks_key(customer))


def search(customer: str, question: str, policy_spec: str, k: int, parallel: int) -> dict[str, Any]:
    """Answer from the customer's built index; the index must have been materialized (`sync`)."""
    from serving.search import run_search

    index, _ = open_index(customer)
    response = run_search(index, question, policy_spec, k, parallel)
    return {"customer": customer, "question": question, "policy": policy_spec, **response.as_dict()}


def run_tasks(customer: str) -> dict[str, Any]:
    """Materialize the three task assets and report counts by split, hops and failure reason."""
    from orchestration.definitions import defs
    from synth.stage import final_tasks_key, load_tasks, synthetic_key, task_config, task_counts
    from synth.split import apply_splits

    run_job("customer_tasks", customer)
    config = CustomerRegistry().get(customer)
    settings = task_config(customer, config.domain, config.tasks, str(config.base_dir))
    store = defs.resources["store"].get()
    every = apply_splits(load_tasks(store, synthetic_key(customer)), settings.split_fractions, settings.split_salt)
    return {"customer": customer, **task_counts(every, load_tasks(store, final_tasks_key(customer)))}
