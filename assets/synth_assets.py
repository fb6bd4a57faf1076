"""Lineage stage 3: chroma_index -> synthetic_tasks -> verified_tasks -> distractor_sets."""

import dagster as dg

from assets.index_assets import chroma_index, open_index
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, ChromaResource, CustomersResource, LLMResource
from core.layout import documents_key, synthetic_key, verified_key
from synth.checks import enough_tasks_per_split, supporting_quotes_found
from synth.per_customer import load_tasks, run_distractors, run_synthesis, run_verification_split

MIN_TASKS_PER_SPLIT = 1


def _setup(context, customers: CustomersResource):
    name = context.partition_key
    config = customers.get(name)
    return name, config, config.tasks


@dg.asset(
    partitions_def=customers_partitions,
    group_name="tasks",
    kinds={"python", "openai"},
    deps=[chroma_index],
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    description="Explore -> clues -> question -> answer with quotes (LLM teacher, or the extractive generator offline); "
    "verified by extraction, chained; failed tasks kept with reasons. Resumes from per-seed records.",
)
def synthetic_tasks(
    context: dg.AssetExecutionContext,
    store: ArtifactStoreResource,
    chroma: ChromaResource,
    customers: CustomersResource,
    teacher_llm: LLMResource,
) -> dg.MaterializeResult:
    name, config, settings = _setup(context, customers)
    llm = teacher_llm.for_customer(config)
    backend = open_index(name, store, chroma, customers)
    tasks, summary = run_synthesis(name, store.get(), backend, settings, llm)
    generator = settings.generator if settings.generator == "extractive" or llm else "extractive"
    return dg.MaterializeResult(
        metadata={
            "generated": len(tasks),
            "verified": sum(task.passed_verification for task in tasks),
            "generator": generator,
            "teacher": llm.describe() if llm else "none (offline extractive generator)",
            **{k: v for k, v in summary.items() if k in ("failed", "seeds", "seeds_resumed", "seeds_without_tasks", "llm_usage")},
            "path": dg.MetadataValue.path(store.get().uri(synthetic_key(name))),
        }
    )


@dg.asset(
    partitions_def=customers_partitions,
    group_name="tasks",
    kinds={"python", "huggingface"},
    deps=[synthetic_tasks],
    description="Verified tasks split train/dev/test by a hash of the task id, stratified by hops; a datasets folder too.",
)
def verified_tasks(context: dg.AssetExecutionContext, store: ArtifactStoreResource, customers: CustomersResource) -> dg.MaterializeResult:
    name, _, settings = _setup(context, customers)
    tasks = run_verification_split(name, store.get(), settings)
    verified = [task for task in tasks if task.passed_verification]
    by_split = {split: sum(task.split == split for task in verified) for split in ("train", "dev", "test")}
    by_hops: dict[str, int] = {}
    for task in verified:
        by_hops[str(task.hops)] = by_hops.get(str(task.hops), 0) + 1
    return dg.MaterializeResult(
        metadata={"verified": len(verified), "by_split": by_split, "by_hops": dict(sorted(by_hops.items())), "path": dg.MetadataValue.path(store.get().uri(verified_key(name)))}
    )


@dg.asset_check(asset=verified_tasks, blocking=True, description="Every split has enough verified tasks to train and evaluate on.")
def enough_verified_tasks_per_split(context: dg.AssetCheckExecutionContext, store: ArtifactStoreResource) -> dg.AssetCheckResult:
    passed, details = enough_tasks_per_split(load_tasks(store.get(), verified_key(context.partition_key)), MIN_TASKS_PER_SPLIT)
    return dg.AssetCheckResult(passed=passed, metadata=details)


@dg.asset_check(asset=verified_tasks, blocking=True, description="Every kept supporting quote is found in its document.")
def supporting_quotes_in_documents(context: dg.AssetCheckExecutionContext, store: ArtifactStoreResource) -> dg.AssetCheckResult:
    artifacts = store.get()
    documents = artifacts.read_parquet(documents_key(context.partition_key))
    texts = dict(zip(documents["doc_id"].to_list(), documents["text"].to_list()))
    passed, details = supporting_quotes_found(load_tasks(artifacts, verified_key(context.partition_key)), texts)
    return dg.AssetCheckResult(passed=passed, metadata=details)


@dg.asset(
    partitions_def=customers_partitions,
    group_name="tasks",
    kinds={"python", "chroma"},
    deps=[verified_tasks],
    description="Per task, up to N near-miss chunks by hybrid search on the clues, verified NOT to contain the answer.",
)
def distractor_sets(
    context: dg.AssetExecutionContext,
    store: ArtifactStoreResource,
    chroma: ChromaResource,
    customers: CustomersResource,
    teacher_llm: LLMResource,
) -> dg.MaterializeResult:
    name, config, settings = _setup(context, customers)
    tasks = run_distractors(name, store.get(), open_index(name, store, chroma, customers), settings, teacher_llm.for_customer(config))
    kept = sum(len(task.distractors) for task in tasks)
    rejected = sum(len(task.rejected_distractors) for task in tasks)
    return dg.MaterializeResult(metadata={"tasks": len(tasks), "distractors": kept, "rejected": rejected})
