"""Jobs: the scheduled corpus resync, and the whole lineage for one customer."""

from __future__ import annotations

import dagster as dg

from assets.partitions import customers_partitions
from orchestration.run_tags import job_tags, limits_config


def queue_limits(name: str) -> dict:
    """The run queue's per-customer and accelerator limits for `name` (orchestration/run_tags.py)."""
    return {"config": limits_config(name), "tags": job_tags(name)}

CORPUS_RESYNC_ASSETS = ["raw_documents", "chunks", "chroma_index"]

corpus_resync_job = dg.define_asset_job(
    name="corpus_resync",
    **queue_limits("corpus_resync"),
    selection=dg.AssetSelection.assets(*CORPUS_RESYNC_ASSETS),
    partitions_def=customers_partitions,
    description="Incremental resync of a customer's sources into documents, chunks and the index.",
    # Three assets in a chain and their checks: one process per step would pay the imports
    # (torch, the embedder) six times per resync for no parallelism.
    executor_def=dg.in_process_executor,
)

TASK_ASSETS = ["synthetic_tasks", "verified_tasks", "distractor_sets"]

customer_tasks_job = dg.define_asset_job(
    name="customer_tasks",
    selection=dg.AssetSelection.assets(*TASK_ASSETS),
    partitions_def=customers_partitions,
    description="Synthetic search tasks, their verification and split, and distractor sets.",
)

RERANKER_ASSETS = ["reranker_checkpoint"]
SFT_ASSETS = ["sft_trajectories", "sft_checkpoint"]
RL_ASSETS = ["cispo_checkpoint"]

finetune_sft_job = dg.define_asset_job(
    name="finetune_sft",
    **queue_limits("finetune_sft"),
    selection=dg.AssetSelection.assets(*SFT_ASSETS),
    partitions_def=customers_partitions,
    description="Teacher trajectories, the SFT filter and a LoRA SFT checkpoint (`searchsmith finetune --stage sft`).",
)

finetune_reranker_job = dg.define_asset_job(
    name="finetune_reranker",
    **queue_limits("finetune_reranker"),
    selection=dg.AssetSelection.assets(*RERANKER_ASSETS),
    partitions_def=customers_partitions,
    description="The customer's reranker (selection's judge) on its verified tasks, checked on the dev split "
    "(`searchsmith finetune --stage reranker`).",
)

finetune_rl_job = dg.define_asset_job(
    name="finetune_rl",
    **queue_limits("finetune_rl"),
    selection=dg.AssetSelection.assets(*RL_ASSETS),
    partitions_def=customers_partitions,
    description="CISPO RL from the SFT checkpoint (`searchsmith finetune --stage rl`).",
)

finetune_all_job = dg.define_asset_job(
    name="finetune_all",
    **queue_limits("finetune_all"),
    selection=dg.AssetSelection.assets(*SFT_ASSETS, *RL_ASSETS),
    partitions_def=customers_partitions,
    description="SFT then CISPO for one customer (`searchsmith finetune --stage all`).",
)

customer_finetune_job = dg.define_asset_job(
    name="customer_finetune",
    **queue_limits("customer_finetune"),
    selection=dg.AssetSelection.assets("synthetic_tasks").downstream(),
    partitions_def=customers_partitions,
    description="Tasks through served_model for one customer: new tasks, distillation, RL, benchmark and the "
    "promotion gate. Launched on demand or by the corpus change sensor.",
)

serve_job = dg.define_asset_job(
    name="serve_model",
    selection=dg.AssetSelection.assets("served_model"),
    partitions_def=customers_partitions,
    description="The promotion gate on the latest benchmark report (`searchsmith serve`).",
)

all_assets_job = dg.define_asset_job(
    name="customer_lineage",
    **queue_limits("customer_lineage"),
    selection=dg.AssetSelection.all(),
    partitions_def=customers_partitions,
    description="Every asset of the lineage for one customer.",
)
