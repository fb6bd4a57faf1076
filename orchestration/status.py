"""`searchsmith status CUSTOMER`: where a customer stands, on one screen.

Read only, from the Dagster instance (each asset's last materialization of the customer's
partition and its figures, the latest evaluation of every asset check) and the artifact store
(the served policy and the numbers it was promoted on), plus the customer file (the resync cron)
and the instance's schedule state (whether that schedule is running).
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import dagster as dg

from core.registry import CustomerRegistry
from orchestration.console import step_figures

HEADLINE_METRICS = ("answer_found", "recall", "precision", "trajectory_recall", "mean_prompt_tokens")


def _plain(value: Any) -> Any:
    value = getattr(value, "value", value)
    return value if isinstance(value, (str, int, float, bool, list, dict, type(None))) else str(value)


def _iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat(timespec="seconds")


def asset_status(instance: dg.DagsterInstance, asset: dg.AssetKey, customer: str) -> dict[str, Any]:
    """The last materialization of `asset` for `customer`: when, which run, its key figures."""
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset, asset_partitions=[customer]), limit=1).records
    name = asset.to_user_string()
    if not records:
        return {"asset": name, "materialized_at": None, "run_id": None, "figures": "never materialized", "metadata": {}}
    record = records[0]
    materialization = record.asset_materialization
    metadata = {k: _plain(v) for k, v in (materialization.metadata if materialization else {}).items()}
    # Markdown reports and inline plots are for the UI, not for one screen.
    metadata = {k: v for k, v in metadata.items() if not (isinstance(v, str) and len(v) > 300)}
    return {"asset": name, "materialized_at": _iso(record.timestamp), "run_id": record.run_id,
            "figures": step_figures(name, metadata), "metadata": metadata}


def check_status(instance: dg.DagsterInstance, check: dg.AssetCheckKey, customer: str) -> dict[str, Any]:
    """The latest evaluation of one asset check on the customer's partition."""
    history = instance.event_log_storage.get_asset_check_execution_history(check, limit=50)
    for record in history:
        evaluation = record.event.dagster_event.asset_check_evaluation_data if record.event and record.event.dagster_event else None
        partition = record.partition or (evaluation.partition if evaluation is not None else None)
        if partition not in (customer, None) or evaluation is None:
            continue
        if partition is None:  # an unpartitioned record: its run says which customer
            run = instance.get_run_by_id(record.run_id)
            if run is None or run.tags.get("dagster/partition") != customer:
                continue
        return {"check": check.name, "asset": check.asset_key.to_user_string(), "passed": bool(evaluation.passed),
                "severity": getattr(evaluation.severity, "value", str(evaluation.severity)),  # WARN: a failure that does not block
                "evaluated_at": _iso(record.create_timestamp), "run_id": record.run_id,
                "metadata": {k: _plain(v) for k, v in evaluation.metadata.items()}}
    return {"check": check.name, "asset": check.asset_key.to_user_string(), "passed": None, "severity": None, "evaluated_at": None, "run_id": None, "metadata": {}}


def next_resync(instance: dg.DagsterInstance, customer: str, cron: str, now: datetime | None = None) -> dict[str, Any]:
    """The next tick of the customer's resync cron (UTC) and whether the resync sensor runs."""
    from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType
    from dagster._utils.schedules import cron_string_iterator

    from orchestration.automation import RESYNC_SENSOR

    start = (now or datetime.now(timezone.utc)).timestamp()
    upcoming = next(cron_string_iterator(start, cron, "UTC"))
    states = instance.all_instigator_state(instigator_type=InstigatorType.SENSOR)
    running = any(state.instigator_name == RESYNC_SENSOR and state.status == InstigatorStatus.RUNNING for state in states)
    return {"sensor": RESYNC_SENSOR, "cron": cron, "next": upcoming.astimezone(timezone.utc).isoformat(timespec="seconds"), "running": running}


def served_status(customer: str) -> dict[str, Any]:
    from orchestration.runner import resources
    from serving.per_customer import current_serving

    payload = current_serving(resources().store.get(), customer).to_dict()
    served = payload["served"]
    return {"policy": served["policy"], "adapter_path": served.get("adapter_path"), "promoted_at": served.get("promoted_at"),
            "metrics": served.get("metrics") or {}, "server_url": (payload.get("serving") or {}).get("server_url")}


def customer_status(customer: str, instance: dg.DagsterInstance | None = None) -> dict[str, Any]:
    """Everything `searchsmith status` shows, as one JSON-ready object."""
    from orchestration.definitions import defs

    config = CustomerRegistry().get(customer)  # an unknown customer is an error, not an empty screen
    instance = instance or dg.DagsterInstance.get()
    graph = defs.resolve_asset_graph()
    assets = [asset_status(instance, key, customer) for key in graph.toposorted_asset_keys]
    checks = [check_status(instance, key, customer) for key in sorted(graph.asset_check_keys, key=lambda k: k.to_user_string())]
    return {
        "customer": customer,
        "registered": customer in instance.get_dynamic_partitions("customers"),
        "assets": assets,
        "checks": checks,
        "failing_checks": [check["check"] for check in checks if check["passed"] is False and check["severity"] != "WARN"],
        "warning_checks": [check["check"] for check in checks if check["passed"] is False and check["severity"] == "WARN"],
        "served": served_status(customer),
        "resync": next_resync(instance, customer, config.schedule),
    }


def _ago(iso: str | None, now: datetime) -> str:
    if iso is None:
        return "never"
    from orchestration.console import duration

    return f"{duration((now - datetime.fromisoformat(iso)).total_seconds())} ago"


def render_status(payload: dict[str, Any], now: datetime | None = None) -> str:
    """The one screen: assets in lineage order, checks, what is served, the next resync."""
    now = now or datetime.now(timezone.utc)
    width = max(len(asset["asset"]) for asset in payload["assets"]) + 1
    lines = [f"{payload['customer']}" + ("" if payload["registered"] else " (not registered as a partition yet: run `searchsmith sync`)")]
    for asset in payload["assets"]:
        when = _ago(asset["materialized_at"], now)
        lines.append(f"  {asset['asset']:<{width}} {when:>12}  {asset['figures'] if asset['materialized_at'] else ''}".rstrip())
    evaluated = [check for check in payload["checks"] if check["passed"] is not None]
    failing, warning = payload["failing_checks"], payload["warning_checks"]
    lines.append(f"checks: {len(evaluated) - len(failing) - len(warning)} of {len(payload['checks'])} passing"
                 + (f"; WARNING: {', '.join(warning)}" if warning else "")
                 + (f"; FAILING: {', '.join(failing)}" if failing else "")
                 + (f"; {len(payload['checks']) - len(evaluated)} never evaluated" if len(evaluated) < len(payload["checks"]) else ""))
    served = payload["served"]
    lines.append(f"served: {served['policy']}" + (f" (promoted {_ago(served['promoted_at'], now)})" if served.get("promoted_at") else ""))
    for suite, metrics in sorted((served.get("metrics") or {}).items()):
        figures = ", ".join(f"{k} {v:.3f}" if k != "mean_prompt_tokens" else f"{k} {v:,.0f}" for k, v in metrics.items()
                            if k in HEADLINE_METRICS and isinstance(v, (int, float)))
        if figures:
            lines.append(f"  {suite}: {figures}")
    resync = payload["resync"]
    lines.append(f"next resync: {resync['next']} (cron {resync['cron']}; sensor {resync['sensor']} "
                 f"{'running' if resync['running'] else 'stopped: start it in the UI, with the daemon running'})")
    return "\n".join(lines)
