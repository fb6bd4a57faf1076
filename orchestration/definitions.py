"""The Dagster code location: `dagster dev -w workspace.yaml` and the CLI both load this.

Importing it reads no file and no environment variable: the customers are dynamic partitions
(registered by `customer_files_sensor`) and their resync crons are read by
`customer_resync_sensor` when it ticks."""

from __future__ import annotations

import dagster as dg

from assets.benchmark_assets import benchmark_report
from assets.corpus_assets import chunks, raw_documents
from assets.index_assets import chroma_index, dense_recall_matches_brute_force, index_count_matches_chunks_check, no_duplicate_ids_check
from assets.resources import pipeline_resources
from assets.serving_assets import served_model
from assets.synth_assets import distractor_sets, enough_verified_tasks_per_split, supporting_quotes_in_documents, synthetic_tasks, verified_tasks
from assets.training_assets import cispo_checkpoint, reranker_beats_its_start, reranker_checkpoint, sft_checkpoint, sft_trajectories
from orchestration.automation import corpus_change_sensor, customer_files_sensor, customer_resync_sensor
from orchestration.jobs import (
    all_assets_job,
    corpus_resync_job,
    customer_finetune_job,
    customer_tasks_job,
    finetune_all_job,
    finetune_reranker_job,
    finetune_rl_job,
    finetune_sft_job,
    serve_job,
)


def build_definitions() -> dg.Definitions:
    return dg.Definitions(
        assets=[raw_documents, chunks, chroma_index, synthetic_tasks, verified_tasks, distractor_sets, reranker_checkpoint,
                sft_trajectories, sft_checkpoint, cispo_checkpoint, benchmark_report, served_model],
        asset_checks=[
            index_count_matches_chunks_check,
            no_duplicate_ids_check,
            dense_recall_matches_brute_force,
            enough_verified_tasks_per_split,
            supporting_quotes_in_documents,
            reranker_beats_its_start,
        ],
        jobs=[
            corpus_resync_job,
            customer_tasks_job,
            finetune_sft_job,
            finetune_rl_job,
            finetune_all_job,
            finetune_reranker_job,
            customer_finetune_job,
            serve_job,
            all_assets_job,
        ],
        sensors=[customer_files_sensor, customer_resync_sensor, corpus_change_sensor],
        resources=pipeline_resources().as_dagster(),
    )


defs = build_definitions()
