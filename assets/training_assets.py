"""Lineage stage: distractor_sets -> reranker_checkpoint -> sft_trajectories -> sft_checkpoint -> cispo_checkpoint.

Thin assets over `training.per_customer`: load inputs, call it, attach metadata (counts,
recall histograms, loss and reward curves as inline plots).
"""

import tempfile
from pathlib import Path

import dagster as dg

from agent.adapter_sidecar import read_sidecar
from agent.policy_spec import PolicySpec
from assets.index_assets import open_index
from assets.metadata import training_numbers
from assets.partitions import customers_partitions
from assets.resources import ArtifactStoreResource, ChromaResource, CustomersResource, LLMResource
from assets.synth_assets import distractor_sets
from core.layout import chunks_key, final_tasks_key, kept_trajectories_key, sft_dataset_prefix
from evaluation.per_customer import png_markdown
from serving.per_customer import customer_reranker
from serving.served_state import load_served
from synth.per_customer import load_tasks
from training.per_customer import (
    CheckpointManifest,
    collect_sft_trajectories,
    load_kept_trajectories,
    read_reranker,
    starting_adapter,
    student_harness,
    student_policy,
    teacher_policy,
    train_cispo_checkpoint,
    train_reranker_checkpoint,
    train_sft_checkpoint,
    train_tasks,
)


def _train_split(name: str, store: ArtifactStoreResource, max_tasks: int | None) -> list:
    artifacts = store.get()
    return train_tasks(load_tasks(artifacts, final_tasks_key(name)), artifacts.read_parquet(chunks_key(name)), max_tasks)


def _checkpoint_metadata(manifest: CheckpointManifest) -> dict:
    """The adapter's sidecar (config, data lineage, metrics) as Dagster metadata, scalars as numbers."""
    scalars = {k: v for k, v in manifest.metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    sidecar = read_sidecar(manifest.adapter.path)
    return {
        "config": dg.MetadataValue.json(sidecar.get("config") or {}),
        "lineage": dg.MetadataValue.json({**(sidecar.get("lineage") or {}), **manifest.lineage}),
        "adapter_path": dg.MetadataValue.path(manifest.adapter.path),
        "adapter_store_key": manifest.adapter.store_key or "",
        "base_model": manifest.adapter.base_model or "",
        "steps": manifest.steps,
        "run_id": manifest.run_id,
        "reused": manifest.reused,
        "policy": manifest.policy,
        "metrics": dg.MetadataValue.json(manifest.metrics),
        **{f"metric_{k}": float(v) for k, v in sorted(scalars.items())},
        **training_numbers(manifest.stage, manifest.metrics),  # `loss`, `reward`: the same keys every run
    }


@dg.asset(
    partitions_def=customers_partitions,
    group_name="training",
    kinds={"pytorch", "huggingface"},
    deps=[distractor_sets, "chroma_index"],
    description="A bi-encoder (or cross-encoder: training.reranker.kind) fine-tuned on the customer's own verified train split "
    "(supporting chunks against hybrid hard negatives), judged on the dev split against its untrained start; "
    "selection (`+rerank` candidates) uses it. Reused when nothing that determines it changed.",
)
def reranker_checkpoint(
    context: dg.AssetExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource
) -> dg.MaterializeResult:
    name = context.partition_key
    config = customers.get(name)
    settings = config.training.reranker
    if not settings.enabled:
        return dg.MaterializeResult(metadata={"enabled": False})
    artifacts = store.get()
    checkpoint = train_reranker_checkpoint(name, artifacts, open_index(name, store, chroma, customers),
                                           load_tasks(artifacts, final_tasks_key(name)), artifacts.read_parquet(chunks_key(name)),
                                           settings, customers.home_dir(), k=config.benchmark.k)
    train = checkpoint.train
    how = "reused" if checkpoint.reused else f"{train.get('pairs')} pairs"
    context.log.info(f"reranker {checkpoint.path} ({how}): "
                     f"dev recall@k {checkpoint.dev['trained']['recall_at_k']:.3f} vs start {checkpoint.dev['start']['recall_at_k']:.3f}")
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(checkpoint.path), "run_id": checkpoint.run_id, "reused": checkpoint.reused, "base": checkpoint.base,
        "train": dg.MetadataValue.json(train), "dev": dg.MetadataValue.json(checkpoint.dev), "beats_start": checkpoint.beats_start,
        # trained first: the console's step line shows the first figures
        **{f"dev/{row}/{metric}": float(value) for row in ("trained", "start", "hybrid") for metric, value in checkpoint.dev[row].items()},
        **{f"train/{key}": float(train[key]) for key in ("pairs", "pairs_per_s", "train_s") if key in train},
        **{f"dev_brief/{row}/recall_at_k": float(figures["recall_at_k"]) for row, figures in checkpoint.dev_brief.items()},
        "selection": dg.MetadataValue.json(checkpoint.selection),
        "selection_policy_weight": float(checkpoint.selection.get("policy_weight", 1.0)),
        "selection_chain_anchors": int(checkpoint.selection.get("chain_anchors", 0)),
        **{f"selection/{policy}/{key}": float(choice[key]) for policy, choice in checkpoint.selection.get("by_policy", {}).items()
           for key in ("policy_weight", "chain_anchors")},
    })


@dg.asset_check(asset=reranker_checkpoint, blocking=True,
                description="On the dev split (tasks training never saw), the trained reranker orders hybrid's top documents "
                "better than the start it was trained from. A warning, not a stop, when the start already ranks every "
                "dev task perfectly and the trained reranker does too (no gain can show).")
def reranker_beats_its_start(context: dg.AssetCheckExecutionContext, store: ArtifactStoreResource, customers: CustomersResource) -> dg.AssetCheckResult:
    name = context.partition_key
    if not customers.get(name).training.reranker.enabled:
        return dg.AssetCheckResult(passed=True, metadata={"enabled": False})
    checkpoint = read_reranker(store.get(), name)
    if checkpoint is None:
        return dg.AssetCheckResult(passed=False, metadata={"reason": "no reranker checkpoint"})
    verdict, why = checkpoint.verdict()
    return dg.AssetCheckResult(
        passed=verdict == "pass", description=why,
        severity=dg.AssetCheckSeverity.WARN if verdict == "warn" else dg.AssetCheckSeverity.ERROR, metadata={
        "trained_recall_at_k": checkpoint.dev["trained"]["recall_at_k"], "start_recall_at_k": checkpoint.dev["start"]["recall_at_k"],
        "trained_mrr": checkpoint.dev["trained"]["mrr"], "start_mrr": checkpoint.dev["start"]["mrr"],
        "hybrid_recall_at_k": checkpoint.dev["hybrid"]["recall_at_k"], "dev_tasks": checkpoint.dev["trained"]["tasks"]})


@dg.asset(
    partitions_def=customers_partitions,
    group_name="training",
    kinds={"python", "huggingface"},
    deps=[distractor_sets, reranker_checkpoint],
    retry_policy=dg.RetryPolicy(max_retries=2, delay=30, backoff=dg.Backoff.EXPONENTIAL),
    description="A teacher (the customer's endpoint, or the offline heuristic) runs the harness on the train split; "
    "Context-1's recall filter keeps the trajectories to distil. Resumes per rollout; a datasets folder too.",
)
def sft_trajectories(
    context: dg.AssetExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource,
    policy_llm: LLMResource,
) -> dg.MaterializeResult:
    name = context.partition_key
    config = customers.get(name)
    settings = config.training
    tasks = _train_split(name, store, settings.teacher.max_tasks)
    served = load_served(store.get(), name)
    teacher = teacher_policy(config, settings.teacher, max_docs=student_harness(settings).max_output_docs,
                             llm=policy_llm.for_customer(config), served=PolicySpec.parse(served.policy) if served else None)
    reranker = customer_reranker(store.get(), name) if teacher.selects else None
    if teacher.selects and reranker is None:
        raise ValueError(f"customer {name!r}: the teacher {teacher.description} selects with the customer's reranker, and there "
                         "is none yet: materialize reranker_checkpoint first")
    context.log.info(f"teacher {teacher.description}: {settings.teacher.k_rollouts} rollout(s) on {len(tasks)} train tasks")
    with tempfile.TemporaryDirectory() as folder:
        data = collect_sft_trajectories(name, store.get(), open_index(name, store, chroma, customers), tasks, teacher.policy,
                                        settings.teacher, Path(folder), harness=student_harness(settings),
                                        student=student_policy(settings), reranker=reranker)
        histogram = png_markdown(data.histogram) if data.histogram else ""
    filtered = data.metadata.pop("filter")
    return dg.MaterializeResult(metadata={
        **{k: v for k, v in data.metadata.items() if k != "failures"},
        "failures": dg.MetadataValue.json(data.metadata.get("failures", [])),
        "kept": filtered["kept"],
        "filter_counts": dg.MetadataValue.json(filtered["counts"]),
        "filter": dg.MetadataValue.json(filtered),
        "recall_histogram": dg.MetadataValue.md(histogram),
        "path": dg.MetadataValue.path(store.get().uri(kept_trajectories_key(name))),
        "dataset": dg.MetadataValue.path(store.get().uri(sft_dataset_prefix(name))),
    })


@dg.asset(
    partitions_def=customers_partitions,
    group_name="training",
    kinds={"pytorch", "huggingface"},
    deps=[sft_trajectories],
    description="LoRA SFT (TRL SFTTrainer, peft, assistant tokens only) of the base model on the kept trajectories; "
    "the adapter in peft layout with a sidecar, reused when nothing that determines it changed.",
)
def sft_checkpoint(context: dg.AssetExecutionContext, store: ArtifactStoreResource, customers: CustomersResource) -> dg.MaterializeResult:
    from training.sft_plots import plot_loss_curve

    name = context.partition_key
    config = customers.get(name)
    trajectories = load_kept_trajectories(store.get(), name)
    sft = config.training.sft
    golds = {task.task_id: task.gold for task in _train_split(name, store, None)} if sft.answer_steps and sft.answer_target == "gold" else None
    manifest, curve = train_sft_checkpoint(name, store.get(), trajectories, config.training, customers.home_dir(),
                                           init_adapter=starting_adapter(config), golds=golds)
    context.log.info(f"SFT adapter {manifest.adapter.path} ({'reused' if manifest.reused else f'{manifest.steps} steps'})")
    metadata = _checkpoint_metadata(manifest)
    if curve:
        with tempfile.TemporaryDirectory() as folder:
            metadata["loss_curve"] = dg.MetadataValue.md(png_markdown(plot_loss_curve(curve, Path(folder) / "loss.png", f"SFT loss ({name})")))
    return dg.MaterializeResult(metadata=metadata)


@dg.asset(
    partitions_def=customers_partitions,
    group_name="training",
    kinds={"pytorch"},
    deps=[sft_checkpoint],
    description="CISPO RL from the SFT adapter: group rollouts through the harness, Context-1's reward with a hop "
    "curriculum, checkpoints every N steps; a crashed run resumes from its last checkpoint.",
)
def cispo_checkpoint(
    context: dg.AssetExecutionContext, store: ArtifactStoreResource, chroma: ChromaResource, customers: CustomersResource
) -> dg.MaterializeResult:
    from training.cispo_plots import plot_cispo_curves

    name = context.partition_key
    config = customers.get(name)
    settings = config.training
    benchmark_k = config.benchmark.k
    tasks = _train_split(name, store, settings.rl.max_tasks)

    def log(row: dict) -> None:
        context.log.info(f"CISPO step {row.get('step')}: reward {row.get('reward_mean')}, loss {row.get('loss')}")

    manifest, history = train_cispo_checkpoint(name, store.get(), open_index(name, store, chroma, customers), tasks,
                                               settings, customers.home_dir(), log=log, benchmark_k=benchmark_k,
                                               init_adapter=starting_adapter(config))
    metadata = _checkpoint_metadata(manifest)
    if history:
        with tempfile.TemporaryDirectory() as folder:
            metadata["curves"] = dg.MetadataValue.md(png_markdown(plot_cispo_curves(history, Path(folder) / "cispo.png", f"CISPO ({name})")))
    return dg.MaterializeResult(metadata=metadata)
