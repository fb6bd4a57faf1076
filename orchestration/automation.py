"""Schedules and sensors: per-customer resync crons, the partition-registering sensor, and the
sensor that retrains a customer whose corpus changed enough."""


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


def resync_schedule(name: str, cron: str) -> dg.ScheduleDefinition:
    """One schedule per customer, on the cron of its customer file."""

    @dg.schedule(name=f"corpus_resync_{name.replace('-', '_')}", cron_schedule=cron, job=corpus_resync_job, default_status=dg.DefaultScheduleStatus.STOPPED)
    def _schedule(context: dg.ScheduleEvaluationContext):
        if name not in context.instance.get_dynamic_partitions(customers_partitions.name):
            return dg.SkipReason(f"customer {name} is not registered as a partition yet")
        return dg.RunRequest(partition_key=name, tags={"customer": name}, run_key=f"{name}:{context.scheduled_execution_time.isoformat()}")

    return _schedule


def customer_schedules() -> list[dg.ScheduleDefinition]:
    return [resync_schedule(name, config.schedule) for name, config in sorted(CustomerRegistry().customers().items())]


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
