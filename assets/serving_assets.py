"""Lineage stage: benchmark_report -> served_model (the promotion gate and the deployment)."""

import dagster as dg

from assets.benchmark_assets import benchmark_report
from assets.metadata import suite_numbers
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, CustomersResource
from serving.per_customer import promote_best
from serving.promotion import decision_table


@dg.asset(
    partitions_def=customers_partitions,
    group_name="serving",
    kinds={"python", "vllm"},
    deps=[benchmark_report],
    retry_policy=dg.RetryPolicy(max_retries=2, delay=15, backoff=dg.Backoff.EXPONENTIAL),
    description="Promotion gate: the best eligible candidate on the test split replaces the served policy only if it "
    "beats it by a margin with no benchmark regressing beyond a tolerance; promoted adapters load into the "
    "customer's vLLM server (dynamic LoRA loading) and the serving manifest is rewritten.",
)
def served_model(context: dg.AssetExecutionContext, store: ArtifactStoreResource, customers: CustomersResource) -> dg.MaterializeResult:
    name = context.partition_key
    outcome = promote_best(store.get(), name, customers.get(name).serving)
    context.log.info(("promoted: " if outcome.promoted else "not promoted: ") + outcome.reason)
    decision = outcome.decision
    served = outcome.served
    metadata = {
        "promoted": outcome.promoted,
        "status": decision.status if decision else "none",
        "reason": outcome.reason,
        "served_policy": served.policy if served else "heuristic (nothing promoted)",
        "decision": dg.MetadataValue.md(decision_table(decision)) if decision else "",
        "numbers": dg.MetadataValue.json(decision.model_dump(mode="json") if decision else {}),
    }
    # The served policy's figures per suite under stable keys: the UI plots what is served over time.
    metadata.update(suite_numbers("served", served.metrics if served is not None else {}))
    if decision is not None and decision.test_gain is not None:
        metadata["test_gain"] = float(decision.test_gain)
    if served is not None and served.adapter is not None:
        metadata["adapter_path"] = dg.MetadataValue.path(served.adapter.path)
    if outcome.manifest is not None:
        metadata["server_url"] = outcome.manifest.server_url or "in-process (no vLLM server configured)"
        metadata["serving_manifest"] = dg.MetadataValue.json(outcome.manifest.model_dump())
    return dg.MaterializeResult(metadata=metadata)
