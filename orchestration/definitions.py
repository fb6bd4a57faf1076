"""The Dagster code location: `dagster dev -w workspace.yaml` and the CLI both load this."""

from __future__ import annotations

import dagster as dg

from assets.corpus_assets import chunks, raw_documents
from orchestration.automation import customer_files_sensor, customer_schedules
from orchestration.jobs import all_assets_job, corpus_resync_job
from orchestration.resources import ArtifactStoreResource, CustomersResource


def build_definitions() -> dg.Definitions:
    return dg.Definitions(
        assets=[raw_documents, chunks],
        jobs=[corpus_resync_job, all_assets_job],
        schedules=customer_schedules(),
        sensors=[customer_files_sensor],
        resources={
            "store": ArtifactStoreResource(location=dg.EnvVar("SEARCHSMITH_ARTIFACTS").get_value("") or ""),
            "customers": CustomersResource(),
        },
    )


defs = build_definitions()
