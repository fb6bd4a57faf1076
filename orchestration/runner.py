"""Run Dagster jobs in-process against the persistent instance, and read back their metadata."""

from __future__ import annotations

import logging
from functools import lru_cache
from typing import Any

import dagster as dg

from assets.partitions import customers_partitions
from assets.resources import PipelineResources, pipeline_resources
from core.layout import benchmark_summary_key, chunks_key, final_tasks_key, source_status_key, synthetic_key, verified_key
from core.registry import CustomerRegistry
from orchestration.errors import CliError, JobFailed

LOG = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def instance() -> dg.DagsterInstance:
    return dg.DagsterInstance.get()


@lru_cache(maxsize=1)
def resources() -> PipelineResources:
    """The resources commands use: the same ones the code location gives its runs."""
    return pipeline_resources()


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
    from orchestration.console import job_run_options
    from orchestration.definitions import defs

    job = defs.resolve_job_def(job_name)
    result = job.execute_in_process(
        partition_key=customer, instance=instance(), raise_on_error=False, tags={"customer": customer, **(tags or {})},
        **job_run_options(instance()),  # inside a CLI command: events to its log file and status line
    )
    if not result.success:
        raise JobFailed(f"{job_name} for {customer}: {failure_message(result)} (run {result.run_id})")
    return materialization_metadata(result)


def run_corpus_resync(customer: str) -> dict[str, Any]:
    """`searchsmith sync`: counts, each source's status, and `failed_sources` (the CLI exits 1
    when any source could not be listed; the other sources were still synced and indexed)."""
    import json


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
    store = resources().store.get()
    payload["sources"] = json.loads(store.read_text(source_status_key(customer)))  # written by this run's raw_documents
    payload["failed_sources"] = [status["source"] for status in payload["sources"] if status["status"] != "ok"]
    return payload


def open_index(customer: str):
    """The customer's built index and its chunks (for fact-level gold)."""
    from search.per_customer import embedder_for, open_customer_index

    config = CustomerRegistry().get(customer)
    store, chroma = resources().store.get(), resources().chroma
    embedder = embedder_for(config.embedding)
    try:
        index = open_customer_index(customer, store, chroma.client(), embedder, chroma.cache_dir())
    except LookupError as error:
        raise CliError(f"no index for customer {customer!r} yet: run `searchsmith sync {customer}` first ({error})") from None
    return index, store.read_parquet(chunks_key(customer))


def search(customer: str, question: str, policy_spec: str, k: int, parallel: int, save: str | None = None) -> dict[str, Any]:
    """Answer from the customer's built index; the index must have been materialized (`sync`).
    `save`: a JSONL file for the whole trajectories (one line per rollout), as the viewer opens."""
    from agent.policy_spec import PolicySpec
    from agent.trajectory import write_jsonl
    from serving.per_customer import customer_reranker
    from serving.search import PolicyFailed, run_search

    spec = PolicySpec.parse(policy_spec)  # the CLI's edge: a bad spec fails before the index opens
    index, _ = open_index(customer)
    reranker = customer_reranker(resources().store.get(), customer) if spec.rerank else None
    try:
        response = run_search(index, question, spec, k, parallel, reranker=reranker)
    except PolicyFailed as error:  # an unreachable endpoint is an error, never an empty answer
        hint = "; check that the endpoint is up and serves the model" if policy_spec.startswith("openai:") else ""
        raise CliError(f"{error}{hint}") from None
    saved = {"saved": str(write_jsonl(response.trajectories, save))} if save else {}
    return {"customer": customer, "question": question, "policy": policy_spec, **response.as_dict(), **saved}


def run_tasks(customer: str) -> dict[str, Any]:
    """Materialize the three task assets and report counts by split, hops and failure reason."""
    from synth.per_customer import load_tasks, task_counts
    from synth.split import apply_splits

    run_job("customer_tasks", customer)
    config = CustomerRegistry().get(customer)
    settings = config.tasks
    store = resources().store.get()
    every = apply_splits(load_tasks(store, synthetic_key(customer)), settings.split_fractions, settings.split_salt)
    return {"customer": customer, **task_counts(every, load_tasks(store, final_tasks_key(customer)))}


FINETUNE_JOBS = {"sft": "finetune_sft", "rl": "finetune_rl", "all": "finetune_all", "reranker": "finetune_reranker"}


def run_finetune(customer: str, stage: str) -> dict[str, Any]:
    """Materialize the training assets of `stage` and report the last adapter it produced."""
    from training.per_customer import read_manifest

    if stage not in FINETUNE_JOBS:
        raise CliError(f"unknown stage {stage!r}; use sft, rl, all or reranker")
    CustomerRegistry().get(customer)  # an unknown customer (or a bad file) is named as such, not as "no tasks"
    store = resources().store.get()
    if not store.exists(final_tasks_key(customer)):
        if store.exists(verified_key(customer)):  # tasks ran and stopped at its check: say what it found
            from synth.per_customer import load_tasks

            verified = load_tasks(store, verified_key(customer))
            by_split = ", ".join(f"{split} {sum(task.split == split for task in verified)}" for split in ("train", "dev", "test"))
            raise CliError(f"customer {customer!r} has too few verified tasks to train on ({by_split}): the last "
                           f"`searchsmith tasks {customer}` stopped at its check; more documents (`searchsmith sync "
                           f"{customer}`) or more task seeds (tasks.max_seeds in the customer file) give more")
        raise CliError(f"no verified tasks for customer {customer!r} yet: run `searchsmith tasks {customer}` first")
    if stage == "rl" and read_manifest(store, customer, "sft") is None:
        LOG.warning("no SFT checkpoint for %s: CISPO starts from a fresh LoRA on the base model", customer)
    metadata = run_job(FINETUNE_JOBS[stage], customer)
    if stage == "reranker":
        from training.per_customer import read_reranker

        checkpoint = read_reranker(store, customer)
        if checkpoint is None:
            raise CliError(f"customer {customer!r} has training.reranker.enabled: false")
        reused = bool(metadata.get("reranker_checkpoint", {}).get("reused", False))
        return {"customer": customer, "stage": stage, **checkpoint.to_dict(), "reused": reused}
    stages = {name: read_manifest(store, customer, name) for name in ("sft", "cispo")}
    last = stages["sft"] if stage == "sft" else stages["cispo"]
    assert last is not None  # the job succeeded, so its manifest was written
    # This run's own materialization says whether it trained or reused (the manifest keeps the
    # run that trained it).
    reused = bool(metadata.get(f"{last.stage}_checkpoint", {}).get("reused", False))
    return {
        "customer": customer, "stage": stage, "adapter_path": last.adapter.path, "base_model": last.adapter.base_model,
        "steps": last.steps, "metrics": last.metrics, "reused": reused, "policy": last.policy,
        "stages": {name: m.to_dict() for name, m in stages.items() if m is not None and (stage == "all" or name == last.stage)},
    }


def _serving_settings(customer: str):

    return CustomerRegistry().get(customer).serving


def run_serve(customer: str, rollback: bool = False) -> dict[str, Any]:
    """`searchsmith serve`: the promotion gate on the latest benchmark (a `served_model` run), or
    a rollback to the previously served policy."""
    from serving.per_customer import current_serving, rollback_served
    from serving.served_state import NothingToRollBack

    store = resources().store.get()
    settings = _serving_settings(customer)
    if rollback:
        try:
            outcome = rollback_served(store, customer, settings)
        except NothingToRollBack as error:
            raise CliError(str(error)) from None
        return {"customer": customer, **outcome.to_dict()}
    if not store.exists(benchmark_summary_key(customer)):
        raise CliError(f"no benchmark report for customer {customer!r} yet: materialize benchmark_report "
                       f"(`searchsmith demo`, or the customer_finetune job) first")
    metadata = run_job("serve_model", customer).get("served_model", {})
    payload = current_serving(store, customer).to_dict()
    decision = metadata.get("numbers") or None
    return {"customer": customer, **payload, "promoted": bool(metadata.get("promoted")), "reason": metadata.get("reason", ""),
            "action": "promote", "decision": decision}


def create_api_key(customer: str) -> dict[str, Any]:
    from serving.api_keys import ApiKeyStore

    CustomerRegistry().get(customer)  # keys only for customers that exist
    issued = ApiKeyStore().create(customer)
    return {"customer": customer, "key": issued.key, "key_id": issued.key_id,
            "note": "shown once: only a salted hash is stored"}


def list_api_keys(customer: str) -> dict[str, Any]:
    """`searchsmith keys list CUSTOMER`: key ids and creation times, never secrets or hashes.

    A customer whose file was removed may still hold keys; they are listed so they can be
    revoked. Only a name with no keys at all must be a known customer (a typo is an error, not
    an empty list)."""
    from serving.api_keys import ApiKeyStore

    keys = ApiKeyStore().list(customer)
    if not keys:
        CustomerRegistry().get(customer)
    return {"customer": customer, "keys": [{"key_id": info.key_id, "created_at": info.created_at} for info in keys]}


def revoke_api_key(key_id: str) -> dict[str, Any]:
    """`searchsmith keys revoke ID`: a running search service refuses the key from its next request."""
    from serving.api_keys import ApiKeyStore

    removed = ApiKeyStore().remove(key_id)
    if removed is None:
        raise CliError(f"no API key with id {key_id!r} (see `searchsmith keys list CUSTOMER`)")
    return {"revoked": removed.key_id, "customer": removed.customer}


def search_service_wiring() -> dict[str, Any]:
    """The search service's wiring over this process's resources (the demo's check, tests);
    `searchsmith api` builds the same from the environment without Dagster."""
    from serving.service_wiring import service_wiring

    chroma = resources().chroma
    return service_wiring(resources().store.get(), chroma.client(), chroma.cache_dir())


def check_search_api(customer: str, question: str, k: int = 5) -> dict[str, Any]:
    """Start the search service on a free loopback port, ask it one question with a fresh key for
    `customer`, stop it: the demo's proof that `searchsmith api` answers."""
    import socket
    import threading
    import time

    import httpx
    import uvicorn

    from serving.api import create_app
    from serving.api_keys import ApiKeyStore

    keys = ApiKeyStore()
    issued = keys.create(customer)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(keys, **search_service_wiring()), host="127.0.0.1", port=port,
                                           log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, name="searchsmith-api-check", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise CliError("the search service did not start")
            time.sleep(0.1)
        response = httpx.post(f"http://127.0.0.1:{port}/v1/search", json={"customer": customer, "query": question, "k": k},
                              headers={"Authorization": f"Bearer {issued.key}"}, timeout=600)
        body = response.json()
        if response.status_code != 200:
            raise CliError(f"the search service answered {response.status_code}: {body}")
        return {"status": response.status_code, "policy": body["policy"], "documents": body["documents"], "summary": body["summary"]}
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        keys.revoke(issued.key_id)
