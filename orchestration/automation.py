"""Sensors: the partition-registering sensor, the per-customer resync crons, and the sensor that
retrains a customer whose corpus changed enough.

Why the resync crons are a sensor and not one schedule per customer: schedules are fixed when the
code location loads, so building them meant scanning the customers folder at import, and a new
customer file needed a redeploy. The sensor reads the registry when it ticks."""


import json
import time
from collections.abc import Mapping
from datetime import datetime, timezone

import dagster as dg

from assets.partitions import customers_partitions
from core.registry import CustomerRegistry
from corpus.retrain_trigger import retrain_decision
from orchestration.jobs import corpus_resync_job


@dg.sensor(minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING, description="Registers new customer files as partitions.")
def customer_files_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    customers, problems = CustomerRegistry().scan()
    for problem in problems:
        context.log.warning(f"unusable customer file {problem.path}: {problem.reason}")
    known = set(context.instance.get_dynamic_partitions(customers_partitions.name))
    new = sorted(set(customers) - known)
    requests = [customers_partitions.build_add_request(new)] if new else []
    return dg.SensorResult(dynamic_partitions_requests=requests, skip_reason=None if new else "no new customer files")


RESYNC_SENSOR = "customer_resync_sensor"


def due_resyncs(crons: Mapping[str, str], cursor: Mapping[str, float], now: float) -> tuple[dict[str, datetime], dict[str, float]]:
    """Per customer, the latest tick of its cron in (cursor[customer], now], and the next cursor.

    A customer the cursor has not seen yet starts at `now` (adding a customer does not resync it
    at once: its first resync is its cron's next tick). Ticks missed while the daemon was down
    collapse into one run, as a Dagster schedule's missed ticks do. Pure: times are UTC seconds."""
    from dagster._utils.schedules import cron_string_iterator

    due: dict[str, datetime] = {}
    seen: dict[str, float] = {}
    for name, cron in sorted(crons.items()):
        since = cursor.get(name)
        if since is None:
            seen[name] = now
            continue
        latest = None
        for tick in cron_string_iterator(since, cron, "UTC"):
            if tick.timestamp() > now:
                break
            if tick.timestamp() > since:
                latest = tick
        if latest is not None:
            due[name] = latest.astimezone(timezone.utc)
        seen[name] = now
    return due, seen


@dg.sensor(
    name=RESYNC_SENSOR,
    job=corpus_resync_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.STOPPED,  # a resync crawls the customer's sources: opt in
    description="Each registered customer's `corpus_resync` on the cron of its customer file (`schedule:`), "
    "read when the sensor ticks, so a new or edited customer file needs no redeploy; one run per tick (run key).",
)
def customer_resync_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    customers, problems = CustomerRegistry().scan()
    for problem in problems:
        context.log.warning(f"unusable customer file {problem.path}: {problem.reason}")
    registered = set(context.instance.get_dynamic_partitions(customers_partitions.name))
    crons = {name: config.schedule for name, config in customers.items() if name in registered}
    cursor = json.loads(context.cursor) if context.cursor else {}
    due, seen = due_resyncs(crons, cursor, time.time())
    requests = [
        dg.RunRequest(partition_key=name, run_key=f"{name}:{tick.isoformat()}",
                      tags={"customer": name, "searchsmith/trigger": "schedule", "searchsmith/tick": tick.isoformat()})
        for name, tick in sorted(due.items())
    ]
    return dg.SensorResult(run_requests=requests, cursor=json.dumps(seen, sort_keys=True),
                           skip_reason=None if requests else "no customer's resync cron is due")


@dg.sensor(
    job_name="customer_finetune",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.STOPPED,  # retraining costs accelerator hours: opt in
    description="Launches customer_finetune for a customer whose resync changed more than its "
    "`limits.resync_retrain_share` of the corpus; one run per resync (run key), never two.",
)
def corpus_change_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
    result = context.instance.fetch_materializations(dg.AssetKey("raw_documents"), limit=100, cursor=context.cursor, ascending=True)
    registry = CustomerRegistry()
    customers, _ = registry.scan()
    requests = []
    for record in result.records:
        materialization = record.asset_materialization
        customer = materialization.partition if materialization else None
        if customer is None or customer not in customers:
            continue
        decision = retrain_decision(materialization.metadata, customers[customer].limits.resync_retrain_share)
        context.log.info(f"{customer}: {'retrain' if decision.retrain else 'no retrain'}: {decision.reason}")
        if decision.retrain:
            requests.append(dg.RunRequest(
                run_key=f"retrain:{customer}:{record.storage_id}", partition_key=customer,
                tags={"customer": customer, "searchsmith/trigger": "corpus_change", "searchsmith/changed_share": f"{decision.changed_share:.4f}"},
            ))
    return dg.SensorResult(run_requests=requests, cursor=result.cursor if result.records else context.cursor,
                           skip_reason=None if requests else "no resync changed enough of a corpus")
