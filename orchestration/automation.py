"""Schedules and sensors: per-customer resync crons and the partition-registering sensor."""


import dagster as dg

from corpus.registry import CustomerRegistry
from orchestration.jobs import corpus_resync_job
from orchestration.partitions import customers_partitions


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
