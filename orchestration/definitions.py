"""The Dagster code location: `dagster dev -w workspace.yaml` and the CLI both load this."""

from __future__ import annotations

import dagster as dg

from assets.corpus_assets import chunks, raw_documents
from assets.benchmark_assets import benchmark_report
from assets.index_assets import chroma_index, dense_recall_matches_brute_force, index_count_matches_chunks_check, no_duplicate_ids_check
from assets.synth_assets import (
    distractor_sets,
    enough_verified_tasks_per_split,
    supporting_quotes_in_documents,
    synthetic_tasks,
    verified_tasks,
)
from orchestration.automation import customer_files_sensor, customer_schedules
from orchestration.jobs import all_assets_job, corpus_resync_job, customer_tasks_job
from orchestration.resources import ArtifactStoreResource, ChromaResource, CustomersResource, TeacherLLMResource


def build_definitions() -> dg.Definitions:
    return dg.Definitions(
        assets=[raw_documents, chunks, chroma_index, synthetic_tasks, verified_tasks, distractor_sets, benchmark_report],
        asset_checks=[
            index_count_matches_chunks_check,
            no_duplicate_ids_check,
            dense_recall_matches_brute_force,
            enough_verified_tasks_per_split,
            supporting_quotes_in_documents,
        ],
        jobs=[corpus_resync_job, customer_tasks_job, all_assets_job],
        schedules=customer_schedules(),
        sensors=[customer_files_sensor],
        resources={
            "store": ArtifactStoreResource(location=dg.EnvVar("SEARCHSMITH_ARTIFACTS").get_value("") or ""),
            "customers": CustomersResource(),
            "chroma": ChromaResource(),
            "teacher_llm": TeacherLLMResource(),
        },
    )


defs = build_definitions()
