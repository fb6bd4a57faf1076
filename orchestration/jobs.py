"""Jobs: the scheduled corpus resync, and the whole lineage for one customer."""

from __future__ import annotations

import dagster as dg

from orchestration.partitions import customers_partitions

CORPUS_RESYNC_ASSETS = ["raw_documents", "chunks", "chroma_index"]

corpus_resync_job = dg.define_asset_job(
    name="corpus_resync",
    selection=dg.AssetSelection.assets(*CORPUS_RESYNC_ASSETS),
    partitions_def=customers_partitions,
    description="Incremental resync of a customer's sources into documents, chunks and the index.",
)

TASK_ASSETS = ["synthetic_tasks", "verified_tasks", "distractor_sets"]

customer_tasks_job = dg.define_asset_job(
    name="customer_tasks",
    selection=dg.AssetSelection.assets(*TASK_ASSETS),
    partitions_def=customers_partitions,
    description="Synthetic search tasks, their verification and split, and distractor sets.",
)

all_assets_job = dg.define_asset_job(
    name="customer_lineage",
    selection=dg.AssetSelection.all(),
    partitions_def=customers_partitions,
    description="Every asset of the lineage for one customer.",
)
